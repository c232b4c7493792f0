package e2e_test

import (
	"testing"
)

// dataset: a claim of a class with an S3 source and a secret; after provisioning, the test calls
// NodeStageVolume and NodePublishVolume as kubelet does (with the secret's data) and checks the
// files. Needs the driver to stage datasets (pkg/datasource wired in) and versitygw.
func (s *scenario) dataset(t *testing.T) {
	if !s.c.Features.Datasets {
		t.Skip("the driver does not stage datasets in this tree (pkg/datasource not wired into pkg/driver)")
	}
	t.Skip("TODO")
}

// volumeManager: a VolumeManager with replicas 2 puts the dataset on both nodes and lists them
// in its status.
func (s *scenario) volumeManager(t *testing.T) {
	if !s.c.Features.Workloads || !s.c.Features.Datasets {
		t.Skip("needs the workload-controller and dataset staging in the driver")
	}
	t.Skip("TODO")
}
