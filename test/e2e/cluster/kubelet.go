package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
)

// Mounted is a volume staged and published the way kubelet does it.
type Mounted struct {
	VolumeID    string
	StagingPath string
	TargetPath  string
	conn        *grpc.ClientConn
}

// StageAndPublish does for a bound PersistentVolume what kubelet does on the node it is pinned to:
// NodeStageVolume to a global mount under root with the PV's volume context and the node-stage
// secret's data, then NodePublishVolume to a pod directory under root. The caller unpublishes
// with Unmount.
func StageAndPublish(ctx context.Context, socket string, pv *corev1.PersistentVolume, secrets map[string]string, root string) (*Mounted, error) {
	if pv.Spec.CSI == nil {
		return nil, fmt.Errorf("PV %s is not a CSI volume", pv.Name)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	m := &Mounted{
		VolumeID:    pv.Spec.CSI.VolumeHandle,
		StagingPath: filepath.Join(root, "plugins", "kubernetes.io", "csi", pv.Spec.CSI.Driver, pv.Name, "globalmount"),
		TargetPath:  filepath.Join(root, "pods", "demo", "volumes", "kubernetes.io~csi", pv.Name, "mount"),
		conn:        conn,
	}
	// kubelet creates the staging directory and the target's parent; the driver the rest.
	for _, d := range []string{m.StagingPath, filepath.Dir(m.TargetPath)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			conn.Close()
			return nil, err
		}
	}
	fsType := pv.Spec.CSI.FSType
	if fsType == "" {
		fsType = "ext4"
	}
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	node := csi.NewNodeClient(conn)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId:          m.VolumeID,
		StagingTargetPath: m.StagingPath,
		VolumeCapability:  capability,
		VolumeContext:     pv.Spec.CSI.VolumeAttributes,
		Secrets:           secrets,
	}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("NodeStageVolume %s: %w", m.VolumeID, err)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId:          m.VolumeID,
		StagingTargetPath: m.StagingPath,
		TargetPath:        m.TargetPath,
		VolumeCapability:  capability,
		VolumeContext:     pv.Spec.CSI.VolumeAttributes,
	}); err != nil {
		_ = m.Unmount(ctx)
		return nil, fmt.Errorf("NodePublishVolume %s: %w", m.VolumeID, err)
	}
	return m, nil
}

// Unmount unpublishes and unstages, as kubelet does when the pod goes away.
func (m *Mounted) Unmount(ctx context.Context) error {
	defer m.conn.Close()
	node := csi.NewNodeClient(m.conn)
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: m.VolumeID, TargetPath: m.TargetPath}); err != nil {
		return fmt.Errorf("NodeUnpublishVolume %s: %w", m.VolumeID, err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: m.VolumeID, StagingTargetPath: m.StagingPath}); err != nil {
		return fmt.Errorf("NodeUnstageVolume %s: %w", m.VolumeID, err)
	}
	return nil
}
