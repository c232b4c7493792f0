// Package cacheondisk compares a pool's dataset cache on disk with what its StoragePool object
// publishes. It is apart from testutil because it imports pkg/datasource, whose tests use testutil.
package cacheondisk

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
)

// Dataset is a dataset as a pool's cache directory holds it.
type Dataset struct {
	Ready bool
	Bytes int64 // regular files under tree/
}

// Read reads <pool>/.cistern-cache: every dataset directory (not the trash of an
// eviction), whether it is ready and the bytes of its tree.
func Read(pool string) (map[string]Dataset, error) {
	ents, err := os.ReadDir(filepath.Join(pool, datasource.CacheDirName))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	out := map[string]Dataset{}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var d Dataset
		tree := filepath.Join(pool, datasource.CacheDirName, e.Name(), "tree")
		_ = filepath.WalkDir(tree, func(_ string, de fs.DirEntry, err error) error {
			if err == nil && de.Type().IsRegular() {
				if fi, err := de.Info(); err == nil {
					d.Bytes += fi.Size()
				}
			}
			d.Ready = d.Ready || err == nil
			return nil
		})
		out[e.Name()] = d
	}
	return out, nil
}

// Matches says why the published cache of a StoragePool is not exactly the datasets on disk,
// each Ready with the bytes its tree holds and a label on the object; nil when it is.
func Matches(obj *spapi.StoragePool, disk map[string]Dataset) error {
	c := obj.Status.Cache
	if c == nil {
		return fmt.Errorf("StoragePool %s has no status.cache", obj.Name)
	}
	if int(c.Total) != len(disk) || int(c.Ready) != len(disk) || len(c.Datasets) != len(disk) {
		return fmt.Errorf("StoragePool %s lists %d datasets (%d Ready, total %d), the disk holds %d", obj.Name, len(c.Datasets), c.Ready, c.Total, len(disk))
	}
	var sum int64
	for _, ds := range c.Datasets {
		d, ok := disk[ds.ID]
		switch {
		case !ok || !d.Ready:
			return fmt.Errorf("StoragePool %s lists dataset %s, which is not ready on disk", obj.Name, ds.ID)
		case ds.State != spapi.DatasetReady || ds.BytesDone != d.Bytes || ds.BytesTotal != d.Bytes:
			return fmt.Errorf("StoragePool %s: dataset %s %s with %d/%d bytes, the disk holds %d", obj.Name, ds.ID, ds.State, ds.BytesDone, ds.BytesTotal, d.Bytes)
		case obj.Labels[consts.LabelDatasetPrefix+ds.ID] != "true":
			return fmt.Errorf("StoragePool %s has no label for dataset %s", obj.Name, ds.ID)
		}
		sum += d.Bytes
	}
	for k := range obj.Labels {
		if id, ok := strings.CutPrefix(k, consts.LabelDatasetPrefix); ok {
			if _, ok := disk[id]; !ok {
				return fmt.Errorf("StoragePool %s is labelled with dataset %s, which is not on disk", obj.Name, id)
			}
		}
	}
	if c.Bytes == nil || c.Bytes.Value() != sum {
		return fmt.Errorf("StoragePool %s: status.cache.bytes %v, the disk holds %d", obj.Name, c.Bytes, sum)
	}
	return nil
}
