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
// secret's data, then NodePublishVolume to a pod directory under root, with the access mode the
// PV's access modes give and read-only when the PV is. The caller unpublishes
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
		StagingPath: stagingPath(root, pv),
		TargetPath:  targetPath(root, "demo", pv.Name),
		conn:        conn,
	}
	// As kubelet: the access mode from the PV's, read-only when the PV says so.
	capability := mountCapability(pv.Spec.CSI.FSType, accessMode(pv.Spec.AccessModes))
	node := csi.NewNodeClient(conn)
	if err := stage(ctx, node, pv, m.StagingPath, capability, secrets); err != nil {
		conn.Close()
		return nil, err
	}
	if err := publish(ctx, node, &csi.NodePublishVolumeRequest{
		VolumeId:          m.VolumeID,
		StagingTargetPath: m.StagingPath,
		TargetPath:        m.TargetPath,
		VolumeCapability:  capability,
		VolumeContext:     pv.Spec.CSI.VolumeAttributes,
		Readonly:          pv.Spec.CSI.ReadOnly, // as kubelet: a read-only PV is published read-only
	}); err != nil {
		_ = m.Unmount(ctx)
		return nil, err
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

// stagingPath is the PV's global mount under kubelet root dir.
func stagingPath(root string, pv *corev1.PersistentVolume) string {
	return filepath.Join(root, "plugins", "kubernetes.io", "csi", pv.Spec.CSI.Driver, pv.Name, "globalmount")
}

// targetPath is where a pod's volume is published under kubelet's root dir.
func targetPath(root, podUID, volume string) string {
	return filepath.Join(root, "pods", podUID, "volumes", "kubernetes.io~csi", volume, "mount")
}

func mountCapability(fsType string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	if fsType == "" {
		fsType = "ext4"
	}
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// stage is NodeStageVolume of pv at path; kubelet creates the staging directory, the driver the
// rest.
func stage(ctx context.Context, node csi.NodeClient, pv *corev1.PersistentVolume, path string, capability *csi.VolumeCapability, secrets map[string]string) error {
	if err := os.MkdirAll(path, 0o750); err != nil {
		return err
	}
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId:          pv.Spec.CSI.VolumeHandle,
		StagingTargetPath: path,
		VolumeCapability:  capability,
		VolumeContext:     pv.Spec.CSI.VolumeAttributes,
		Secrets:           secrets,
	}); err != nil {
		return fmt.Errorf("NodeStageVolume %s: %w", pv.Spec.CSI.VolumeHandle, err)
	}
	return nil
}

// publish is NodePublishVolume; kubelet creates the target's parent, the driver the target.
func publish(ctx context.Context, node csi.NodeClient, req *csi.NodePublishVolumeRequest) error {
	if err := os.MkdirAll(filepath.Dir(req.TargetPath), 0o750); err != nil {
		return err
	}
	if _, err := node.NodePublishVolume(ctx, req); err != nil {
		return fmt.Errorf("NodePublishVolume %s: %w", req.VolumeId, err)
	}
	return nil
}
