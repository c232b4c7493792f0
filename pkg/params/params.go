// Package params parses a Cistern volume's parameters once, from one key table, into one typed
// struct: a StorageClass's parameters (CreateVolume, GetCapacity, ValidateVolumeCapabilities), a
// CSI inline volume's attributes, a static PersistentVolume's volumeAttributes, and the attributes
// the VolumeManager controller writes. Every caller gets the same errors. Errors carry a
// source.Kind (Invalid, or Denied for a source a pod author may not name), which
// datasource.Code maps to a gRPC code.
//
// The package is light on purpose (no source clients): admission webhooks and controllers use it.
package params

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Use is where a parameter map comes from; each key is allowed in some of them.
type Use uint8

const (
	// StorageClass is CreateVolume's parameters (a StorageClass), also GetCapacity's and
	// ValidateVolumeCapabilities'.
	StorageClass Use = 1 << iota
	// Inline is a CSI inline ephemeral volume's attributes, written by any pod author.
	Inline
	// StaticPV is a static PersistentVolume's volumeAttributes: a dataset served from the
	// node's cache (the VolumeManager controller writes these).
	StaticPV
)

const everywhere = StorageClass | Inline | StaticPV

func (u Use) String() string {
	switch u {
	case StorageClass:
		return "StorageClass parameters"
	case Inline:
		return "inline volume attributes"
	case StaticPV:
		return "static volume attributes"
	}
	return "parameters"
}

// Volume is what a parameter map says about a volume.
type Volume struct {
	// Pool and PoolSelector target a pool by name or by labels; empty means any pool.
	Pool         string
	PoolSelector labels.Selector
	// Size is an inline volume's requested size in bytes; 0 when none was given.
	Size int64
	// Capacity is a static PV's dataset limit (and writable copy size) in bytes; 0 when none.
	Capacity int64
	// Streaming is a dataset volume published before its dataset is staged
	// (consts.ParamDataMode): read-only, the streaming tree; writable, an overlay on it.
	Streaming bool
	// Dataset is the data the volume starts with; nil for an empty volume.
	Dataset *Dataset
	// OutputTarget is where the write-back uploads a writable dataset volume's changes
	// (s3://bucket/prefix, placeholders not yet replaced); "" for none.
	OutputTarget string
	// OutputDeletions makes the write-back delete at the target what the pods deleted from
	// the dataset.
	OutputDeletions bool
	// OutputInterval is the interval of the write-back's checkpoints while the volume is in
	// use; 0 for none.
	OutputInterval time.Duration
}

// key is one row of the table: where the key is allowed and how its value is read. Dataset keys
// other than `source` need `source`.
type key struct {
	name    string
	uses    Use
	dataset bool
	parse   func(v *Volume, d *Dataset, value string) error
}

// keys is the one table of the keys Cistern understands. Keys under csi.storage.k8s.io/ (added by
// external-provisioner and kubelet) are always accepted and never read.
var keys = []key{
	{consts.ParamPool, everywhere, false, func(v *Volume, _ *Dataset, s string) error { v.Pool = s; return nil }},
	{consts.ParamPoolSelector, everywhere, false, parseSelector},
	{consts.ParamSize, Inline, false, parseSize},
	{consts.ParamCapacity, StaticPV, false, parseCapacity},
	{consts.ParamDataMode, everywhere, true, parseDataMode},
	{consts.ParamSource, everywhere, true, func(_ *Volume, d *Dataset, s string) error { d.Source = s; return nil }},
	{consts.ParamEndpoint, everywhere, true, func(_ *Volume, d *Dataset, s string) error { d.Endpoint = s; return nil }},
	{consts.ParamRegion, everywhere, true, func(_ *Volume, d *Dataset, s string) error { d.Region = s; return nil }},
	{consts.ParamPathStyle, everywhere, true, parsePathStyle},
	{consts.ParamNFSVersion, everywhere, true, parseNFSVersion},
	{consts.ParamCABundle, everywhere, true, parseCABundle},
	{consts.ParamCredentials, everywhere, true, parseCredentials},
	{consts.ParamRoleARN, everywhere, true, func(_ *Volume, d *Dataset, s string) error { d.RoleARN = s; return nil }},
	{consts.ParamRoleFrom, everywhere, true, parseRoleFrom},
	{consts.ParamInclude, everywhere, true, func(_ *Volume, d *Dataset, s string) (err error) {
		d.Include, err = source.ParsePatterns(s)
		return err
	}},
	{consts.ParamExclude, everywhere, true, func(_ *Volume, d *Dataset, s string) (err error) {
		d.Exclude, err = source.ParsePatterns(s)
		return err
	}},
	{consts.ParamOutputTarget, everywhere, false, parseOutputTarget},
	{consts.ParamOutputDeletions, everywhere, false, parseOutputDeletions},
	{consts.ParamOutputInterval, everywhere, false, parseOutputInterval},
}

// IsDatasetKey reports whether name is one of the dataset keys (source and its options).
func IsDatasetKey(name string) bool {
	i := slices.IndexFunc(keys, func(k key) bool { return k.name == name })
	return i >= 0 && keys[i].dataset
}

// Parse validates a parameter map for a use and returns what it says. Unknown keys, and keys not
// allowed for the use, are refused by name, so a typo fails loudly instead of being ignored.
func Parse(m map[string]string, use Use) (Volume, error) {
	var unknown []string
	for k := range m {
		if strings.HasPrefix(k, consts.ReservedParamPrefix) {
			continue
		}
		if i := slices.IndexFunc(keys, func(r key) bool { return r.name == k }); i < 0 || keys[i].uses&use == 0 {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return Volume{}, source.Errorf(source.Invalid, "unknown parameter %q in %s (known: %s)", unknown[0], use, strings.Join(known(use), ", "))
	}
	var v Volume
	var d Dataset
	var datasetKey string
	for _, k := range keys {
		value, ok := m[k.name]
		if !ok {
			continue
		}
		if k.dataset && k.name != consts.ParamSource {
			datasetKey = k.name
		}
		if err := k.parse(&v, &d, value); err != nil {
			return Volume{}, err
		}
	}
	for _, k := range []string{consts.ParamOutputDeletions, consts.ParamOutputInterval} {
		if _, ok := m[k]; ok && v.OutputTarget == "" {
			return Volume{}, source.Errorf(source.Invalid, "parameter %q needs %q", k, consts.ParamOutputTarget)
		}
	}
	if _, ok := m[consts.ParamSource]; !ok {
		if v.OutputTarget != "" {
			datasetKey = consts.ParamOutputTarget
		}
		if datasetKey != "" {
			return Volume{}, source.Errorf(source.Invalid, "parameter %q needs %q", datasetKey, consts.ParamSource)
		}
		return v, nil
	}
	if err := d.parseSource(use == Inline); err != nil {
		return Volume{}, err
	}
	if d.NFSVersion != "" && d.Scheme != SchemeNFS {
		return Volume{}, source.Errorf(source.Invalid, "parameter %s applies to nfs:// sources only", consts.ParamNFSVersion)
	}
	d.Inline = use == Inline
	v.Dataset = &d
	return v, nil
}

func known(use Use) []string {
	var out []string
	for _, k := range keys {
		if k.uses&use != 0 {
			out = append(out, k.name)
		}
	}
	return out
}

// parseOutputTarget checks the shape of an output target; pkg/writeback parses it whole once the
// pod's placeholders are replaced.
func parseOutputTarget(v *Volume, _ *Dataset, s string) error {
	rest, ok := strings.CutPrefix(s, "s3://")
	if !ok {
		rest, ok = strings.CutPrefix(s, "nfs://")
	}
	if !ok || rest == "" || strings.HasPrefix(rest, "/") {
		return source.Errorf(source.Invalid, "parameter %s=%q is not s3://bucket[/prefix] or nfs://server/export[/path]", consts.ParamOutputTarget, s)
	}
	v.OutputTarget = s
	return nil
}

func parseOutputDeletions(v *Volume, _ *Dataset, s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return source.Errorf(source.Invalid, "parameter %s=%q is not true or false", consts.ParamOutputDeletions, s)
	}
	v.OutputDeletions = b
	return nil
}

func parseOutputInterval(v *Volume, _ *Dataset, s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return source.Errorf(source.Invalid, "parameter %s=%q is not a positive duration (e.g. 10m)", consts.ParamOutputInterval, s)
	}
	v.OutputInterval = d
	return nil
}

func parseSelector(v *Volume, _ *Dataset, s string) error {
	sel, err := labels.Parse(s)
	if err != nil {
		return source.Errorf(source.Invalid, "invalid %s %q: %v", consts.ParamPoolSelector, s, err)
	}
	v.PoolSelector = sel
	return nil
}

func parseSize(v *Volume, _ *Dataset, s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return source.Errorf(source.Invalid, "invalid size %q for an inline volume", s)
	}
	v.Size = q.Value()
	return nil
}

func parseCapacity(v *Volume, _ *Dataset, s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return source.Errorf(source.Invalid, "invalid %s %q for a static volume", consts.ParamCapacity, s)
	}
	v.Capacity = q.Value()
	return nil
}

func parseDataMode(v *Volume, _ *Dataset, s string) error {
	switch s {
	case consts.DataModeStaged:
	case consts.DataModeStreaming:
		v.Streaming = true
	default:
		return source.Errorf(source.Invalid, "%s %q: must be %q or %q", consts.ParamDataMode, s, consts.DataModeStaged, consts.DataModeStreaming)
	}
	return nil
}

// caBundleName is a ConfigMap or Secret key: the file the bundle is mounted as.
var caBundleName = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

func parseCABundle(_ *Volume, d *Dataset, s string) error {
	if !caBundleName.MatchString(s) || s == "." || s == ".." {
		return source.Errorf(source.Invalid, "parameter %s=%q is not a ConfigMap or Secret key", consts.ParamCABundle, s)
	}
	d.CABundle = s
	return nil
}

func parseCredentials(_ *Volume, d *Dataset, s string) error {
	switch s {
	case "", "secret":
		d.Credentials = ""
	case consts.CredentialsWebIdentity:
		d.Credentials = s
	default:
		return source.Errorf(source.Invalid, "parameter %s=%q is not secret or %s", consts.ParamCredentials, s, consts.CredentialsWebIdentity)
	}
	return nil
}

// parseNFSVersion keeps "4"; "3", the default, is kept as none, so that a dataset names one
// cache entry however it is written.
func parseNFSVersion(_ *Volume, d *Dataset, s string) error {
	switch s {
	case consts.NFSVersion3:
		d.NFSVersion = ""
	case consts.NFSVersion4:
		d.NFSVersion = s
	default:
		return source.Errorf(source.Invalid, "parameter %s=%q is not %s or %s (NFSv4 is NFSv4.0: the client speaks no later minor version)",
			consts.ParamNFSVersion, s, consts.NFSVersion3, consts.NFSVersion4)
	}
	return nil
}

func parsePathStyle(_ *Volume, d *Dataset, s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return source.Errorf(source.Invalid, "parameter %s=%q is not true or false", consts.ParamPathStyle, s)
	}
	d.PathStyle = b
	return nil
}

// String names the parameters for logs.
func (v Volume) String() string {
	return fmt.Sprintf("pool=%q poolSelector=%v dataset=%v", v.Pool, v.PoolSelector, v.Dataset)
}

func parseRoleFrom(_ *Volume, d *Dataset, s string) error {
	if s != consts.RoleFromServiceAccount {
		return source.Errorf(source.Invalid, "parameter %s=%q is not %s", consts.ParamRoleFrom, s, consts.RoleFromServiceAccount)
	}
	d.RoleFrom = s
	return nil
}
