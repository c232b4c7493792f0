package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
)

// Volume context keys kubelet adds to NodePublishVolume when the CSIDriver asks for pod info.
const (
	podNameKey        = "csi.storage.k8s.io/pod.name"
	podNamespaceKey   = "csi.storage.k8s.io/pod.namespace"
	podUIDKey         = "csi.storage.k8s.io/pod.uid"
	serviceAccountKey = "csi.storage.k8s.io/serviceAccount.name"
)

// MountingKubelet is FakeKubelet for the cluster's nodes with the volume work kubelet does: for
// a pod bound to one of them, each Cistern volume (a claim's PV, or an inline csi volume) is
// staged and published over the node's driver socket with the secrets the PV or the volume
// names, and only then is the pod reported Running; a mount that fails is retried, as kubelet
// does, and the pod stays Pending meanwhile. A pod being deleted is unpublished (a PV unstaged
// once no pod of the node publishes it) before its deletion is confirmed. A pod for which
// completes (may be nil) is true runs to completion: it is reported Succeeded once its volumes
// are mounted, and they are unpublished. Whatever is still mounted when the test ends is
// released.
func (c *Cluster) MountingKubelet(t framework.TB, pods fields.Selector, completes func(*corev1.Pod) bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	k := &mountingKubelet{c: c, client: c.CP.Client, logf: t.Logf, completes: completes, busy: map[types.UID]bool{}, pods: map[types.UID]*podVolumes{}, stages: map[string]*stageRef{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		k.releaseAll()
	})
	handle := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || c.Nodes[pod.Spec.NodeName] == nil {
			return
		}
		if pod.DeletionTimestamp == nil && (pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodSucceeded) {
			return
		}
		if !k.claim(pod.UID) {
			return // work on this pod is under way; the resync brings it back
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer k.release(pod.UID)
			if pod.DeletionTimestamp != nil {
				k.teardown(ctx, pod)
				return
			}
			k.setup(ctx, pod)
		}()
	}
	lw := cache.NewFilteredListWatchFromClient(c.CP.Client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.FieldSelector = pods.String() })
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		ResyncPeriod:  time.Second, // retries mounts that failed and updates that lost a race
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    handle,
			UpdateFunc: func(_, n any) { handle(n) },
			DeleteFunc: func(obj any) {
				if pod, ok := obj.(*corev1.Pod); ok && k.claim(pod.UID) {
					wg.Add(1)
					go func() { defer wg.Done(); defer k.release(pod.UID); k.unmountPod(ctx, pod.UID) }()
				}
			},
		},
	})
	wg.Add(1)
	go func() { defer wg.Done(); informer.Run(ctx.Done()) }()
}

type mountingKubelet struct {
	c         *Cluster
	client    kubernetes.Interface
	logf      func(string, ...any)
	completes func(*corev1.Pod) bool

	mu     sync.Mutex
	busy   map[types.UID]bool
	pods   map[types.UID]*podVolumes
	stages map[string]*stageRef // by node and PV name
}

// podVolumes are the publications of one pod, in the order they were made.
type podVolumes struct {
	node    string
	targets []publication
}

type publication struct {
	// volume is the pod's name for it.
	volume, volumeID, target string
	// pv is set for a claim's volume: its staging is shared by the node's pods.
	pv *corev1.PersistentVolume
}

type stageRef struct {
	mu    sync.Mutex // held while the PV is staged or unstaged
	path  string
	count int
}

func (k *mountingKubelet) claim(uid types.UID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.busy[uid] {
		return false
	}
	k.busy[uid] = true
	return true
}

func (k *mountingKubelet) release(uid types.UID) {
	k.mu.Lock()
	delete(k.busy, uid)
	k.mu.Unlock()
}

func (k *mountingKubelet) nodeClient(node string) (csi.NodeClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+k.c.Nodes[node].Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return csi.NewNodeClient(conn), func() { conn.Close() }, nil
}

// setup publishes every Cistern volume of the pod not yet published, then reports it Running.
// On an error it logs and returns: the informer's resync tries again.
func (k *mountingKubelet) setup(ctx context.Context, pod *corev1.Pod) {
	if err := k.mountPod(ctx, pod); err != nil {
		if ctx.Err() == nil {
			k.logf("kubelet %s: pod %s/%s: %v (retrying)", pod.Spec.NodeName, pod.Namespace, pod.Name, err)
		}
		return
	}
	if k.completes == nil || !k.completes(pod) {
		_, _ = k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, framework.RunningPod(pod), metav1.UpdateOptions{})
		return
	}
	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, succeededPod(pod), metav1.UpdateOptions{}); err != nil {
		return // the resync tries again; the volumes are still published
	}
	if err := k.unmountPod(ctx, pod.UID); err != nil && ctx.Err() == nil {
		k.logf("kubelet %s: finished pod %s/%s: %v", pod.Spec.NodeName, pod.Namespace, pod.Name, err)
	}
}

// succeededPod is pod as kubelet reports it once every container exited 0.
func succeededPod(pod *corev1.Pod) *corev1.Pod {
	p := framework.RunningPod(pod)
	p.Status.Phase = corev1.PodSucceeded
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			c.Status, c.Reason = corev1.ConditionFalse, "PodCompleted"
		}
	}
	for i := range p.Status.ContainerStatuses {
		cs := &p.Status.ContainerStatuses[i]
		started := cs.State.Running.StartedAt
		cs.Ready, cs.Started = false, ptr.To(false)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", StartedAt: started, FinishedAt: metav1.Now()}}
	}
	return p
}

func (k *mountingKubelet) mountPod(ctx context.Context, pod *corev1.Pod) error {
	node := pod.Spec.NodeName
	k.mu.Lock()
	pv := k.pods[pod.UID]
	if pv == nil {
		pv = &podVolumes{node: node}
		k.pods[pod.UID] = pv
	}
	done := map[string]bool{}
	for _, p := range pv.targets {
		done[p.volume] = true
	}
	k.mu.Unlock()
	client, closeConn, err := k.nodeClient(node)
	if err != nil {
		return err
	}
	defer closeConn()
	for _, vol := range pod.Spec.Volumes {
		if done[vol.Name] {
			continue
		}
		var p *publication
		switch {
		case vol.PersistentVolumeClaim != nil:
			p, err = k.publishClaim(ctx, client, pod, vol)
		case vol.CSI != nil && vol.CSI.Driver == consts.DriverName:
			p, err = k.publishInline(ctx, client, pod, vol)
		}
		if err != nil {
			return fmt.Errorf("volume %s: %w", vol.Name, err)
		}
		if p != nil {
			k.mu.Lock()
			pv.targets = append(pv.targets, *p)
			k.mu.Unlock()
		}
	}
	return nil
}

// publishClaim stages the claim's PV on the node (once for all its pods) and publishes it;
// nil for a claim of another driver.
func (k *mountingKubelet) publishClaim(ctx context.Context, client csi.NodeClient, pod *corev1.Pod, vol corev1.Volume) (*publication, error) {
	pvc, err := k.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, vol.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return nil, fmt.Errorf("claim %s is not bound yet", pvc.Name)
	}
	pv, err := k.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != consts.DriverName {
		return nil, nil
	}
	secrets, err := k.secretData(ctx, pv.Spec.CSI.NodeStageSecretRef)
	if err != nil {
		return nil, err
	}
	capability := mountCapability(pv.Spec.CSI.FSType, accessMode(pv.Spec.AccessModes))
	root := k.c.Nodes[pod.Spec.NodeName].KubeletRoot
	staging, target := stagingPath(root, pv), targetPath(root, string(pod.UID), pv.Name)
	ref := k.stageRef(pod.Spec.NodeName, pv.Name, staging)
	ref.mu.Lock()
	defer ref.mu.Unlock()
	if ref.count == 0 {
		if err := stage(ctx, client, pv, staging, capability, secrets); err != nil {
			return nil, err
		}
	}
	publishSecrets, err := k.secretData(ctx, pv.Spec.CSI.NodePublishSecretRef)
	if err != nil {
		return nil, err
	}
	if err := publish(ctx, client, &csi.NodePublishVolumeRequest{
		VolumeId:          pv.Spec.CSI.VolumeHandle,
		StagingTargetPath: staging,
		TargetPath:        target,
		VolumeCapability:  capability,
		Readonly:          vol.PersistentVolumeClaim.ReadOnly || pv.Spec.CSI.ReadOnly,
		VolumeContext:     withPodInfo(pv.Spec.CSI.VolumeAttributes, pod, false),
		Secrets:           publishSecrets,
	}); err != nil {
		if ref.count == 0 {
			_, _ = client.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, StagingTargetPath: staging})
		}
		return nil, err
	}
	ref.count++
	return &publication{volume: vol.Name, volumeID: pv.Spec.CSI.VolumeHandle, target: target, pv: pv}, nil
}

// publishInline publishes a CSI inline volume: no staging; kubelet names it after the pod and
// the volume.
func (k *mountingKubelet) publishInline(ctx context.Context, client csi.NodeClient, pod *corev1.Pod, vol corev1.Volume) (*publication, error) {
	target := targetPath(k.c.Nodes[pod.Spec.NodeName].KubeletRoot, string(pod.UID), vol.Name)
	var secrets map[string]string
	if ref := vol.CSI.NodePublishSecretRef; ref != nil {
		var err error
		if secrets, err = k.secretData(ctx, &corev1.SecretReference{Namespace: pod.Namespace, Name: ref.Name}); err != nil {
			return nil, err
		}
	}
	sum := sha256.Sum256([]byte(string(pod.UID) + vol.Name))
	id := "csi-" + hex.EncodeToString(sum[:])
	fsType := ""
	if vol.CSI.FSType != nil {
		fsType = *vol.CSI.FSType
	}
	if err := publish(ctx, client, &csi.NodePublishVolumeRequest{
		VolumeId:         id,
		TargetPath:       target,
		VolumeCapability: mountCapability(fsType, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		Readonly:         ptr.Deref(vol.CSI.ReadOnly, false),
		VolumeContext:    withPodInfo(vol.CSI.VolumeAttributes, pod, true),
		Secrets:          secrets,
	}); err != nil {
		return nil, err
	}
	return &publication{volume: vol.Name, volumeID: id, target: target}, nil
}

func (k *mountingKubelet) stageRef(node, pv, path string) *stageRef {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := node + "/" + pv
	r := k.stages[key]
	if r == nil {
		r = &stageRef{path: path}
		k.stages[key] = r
	}
	return r
}

func (k *mountingKubelet) secretData(ctx context.Context, ref *corev1.SecretReference) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	s, err := k.client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	out := make(map[string]string, len(s.Data))
	for key, v := range s.Data {
		out[key] = string(v)
	}
	return out, nil
}

// teardown unpublishes the pod's volumes, then confirms its deletion.
func (k *mountingKubelet) teardown(ctx context.Context, pod *corev1.Pod) {
	if err := k.unmountPod(ctx, pod.UID); err != nil {
		if ctx.Err() == nil {
			k.logf("kubelet %s: pod %s/%s: %v (retrying)", pod.Spec.NodeName, pod.Namespace, pod.Name, err)
		}
		return
	}
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		k.logf("kubelet %s: deleting pod %s/%s: %v", pod.Spec.NodeName, pod.Namespace, pod.Name, err)
	}
}

// unmountPod unpublishes what the pod has published, newest first, unstaging a PV that no other
// pod of the node publishes. What fails stays recorded for the next try.
func (k *mountingKubelet) unmountPod(ctx context.Context, uid types.UID) error {
	k.mu.Lock()
	pv := k.pods[uid]
	k.mu.Unlock()
	if pv == nil {
		return nil
	}
	client, closeConn, err := k.nodeClient(pv.node)
	if err != nil {
		return err
	}
	defer closeConn()
	for len(pv.targets) > 0 {
		p := pv.targets[len(pv.targets)-1]
		if _, err := client.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: p.volumeID, TargetPath: p.target}); err != nil {
			return fmt.Errorf("NodeUnpublishVolume %s: %w", p.volumeID, err)
		}
		if p.pv != nil {
			ref := k.stageRef(pv.node, p.pv.Name, "")
			ref.mu.Lock()
			if ref.count == 1 {
				if _, err := client.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: p.volumeID, StagingTargetPath: ref.path}); err != nil {
					ref.mu.Unlock()
					return fmt.Errorf("NodeUnstageVolume %s: %w", p.volumeID, err)
				}
			}
			ref.count--
			ref.mu.Unlock()
		}
		k.mu.Lock()
		pv.targets = pv.targets[:len(pv.targets)-1]
		k.mu.Unlock()
	}
	k.mu.Lock()
	delete(k.pods, uid)
	k.mu.Unlock()
	return nil
}

// releaseAll unmounts what pods still hold when the test ends, before the drivers stop.
func (k *mountingKubelet) releaseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k.mu.Lock()
	uids := make([]types.UID, 0, len(k.pods))
	for uid := range k.pods {
		uids = append(uids, uid)
	}
	k.mu.Unlock()
	for _, uid := range uids {
		if err := k.unmountPod(ctx, uid); err != nil {
			k.logf("kubelet: releasing pod %s at the end: %v", uid, err)
		}
	}
}

// accessMode is the CSI access mode kubelet derives from a PV's access modes.
func accessMode(modes []corev1.PersistentVolumeAccessMode) csi.VolumeCapability_AccessMode_Mode {
	for _, m := range modes {
		switch m {
		case corev1.ReadWriteOncePod:
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		case corev1.ReadWriteMany:
			return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		case corev1.ReadOnlyMany:
			if len(modes) == 1 {
				return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
			}
		}
	}
	return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
}

// withPodInfo is the volume context with the pod's identity, as kubelet adds it for a CSIDriver
// with podInfoOnMount (deploy/csi's has it).
func withPodInfo(attrs map[string]string, pod *corev1.Pod, inline bool) map[string]string {
	out := make(map[string]string, len(attrs)+5)
	for key, v := range attrs {
		out[key] = v
	}
	out[podNameKey] = pod.Name
	out[podNamespaceKey] = pod.Namespace
	out[podUIDKey] = string(pod.UID)
	out[serviceAccountKey] = pod.Spec.ServiceAccountName
	out[consts.ParamInlineContext] = fmt.Sprint(inline)
	return out
}

// PublishedPath is where the stand-in kubelet published a pod's volume on its node: what the
// pod's containers would see. For a claim, volume is the PV's name (as kubelet names the
// directory); for an inline volume, the pod's name for it.
func (c *Cluster) PublishedPath(pod *corev1.Pod, volume string) string {
	return targetPath(c.Nodes[pod.Spec.NodeName].KubeletRoot, string(pod.UID), volume)
}
