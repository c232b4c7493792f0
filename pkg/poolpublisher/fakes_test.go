package poolpublisher

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	spacutil "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1/applyconfiguration"
	spac "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1/applyconfiguration/storagepool/v1alpha1"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

// fakeDriver is an in-test StoragePoolController: its pools can be changed by the test, and it
// bumps its generation and notifies watchers on every change.
type fakeDriver struct {
	spv1.UnimplementedStoragePoolControllerServer
	mu         sync.Mutex
	pools      []*spv1.StoragePool
	generation uint64
	failList   error
	watchers   []chan uint64
}

func (f *fakeDriver) set(pools ...*spv1.StoragePool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pools = pools
	f.generation++
	for _, w := range f.watchers {
		select {
		case w <- f.generation:
		default:
		}
	}
}

func (f *fakeDriver) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failList = err
}

func (f *fakeDriver) ControllerListStoragePools(_ context.Context, req *spv1.ControllerListStoragePoolsRequest) (*spv1.ControllerListStoragePoolsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failList != nil {
		return nil, f.failList
	}
	start := 0
	if req.GetStartingToken() != "" {
		n, err := strconv.Atoi(req.GetStartingToken())
		if err != nil || n > len(f.pools) {
			return nil, status.Error(codes.Aborted, "bad token")
		}
		start = n
	}
	end := len(f.pools)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &spv1.ControllerListStoragePoolsResponse{Generation: f.generation}
	for _, p := range f.pools[start:end] {
		resp.Pools = append(resp.Pools, proto.Clone(p).(*spv1.StoragePool))
	}
	if end < len(f.pools) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}

func (f *fakeDriver) WatchStoragePools(_ *spv1.WatchStoragePoolsRequest, stream grpc.ServerStreamingServer[spv1.WatchStoragePoolsResponse]) error {
	ch := make(chan uint64, 1)
	f.mu.Lock()
	ch <- f.generation
	f.watchers = append(f.watchers, ch)
	f.mu.Unlock()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case g := <-ch:
			if err := stream.Send(&spv1.WatchStoragePoolsResponse{Generation: g}); err != nil {
				return err
			}
		}
	}
}

// startFakeDriver serves f on a unix socket and returns a PoolSource connected to it.
func startFakeDriver(t *testing.T, f *fakeDriver, pageSize int32) *DriverPools {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	spv1.RegisterStoragePoolControllerServer(srv, f)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return NewDriverPools(conn, pageSize)
}

// fakeAPI is a StoragePool store that merges applies with the same server-side apply code the
// API server uses (per subresource), so managedFields, and thus "nothing changed", are real.
// It implements both PoolWriter and ObjectStore, and counts writes.
type fakeAPI struct {
	t       *testing.T
	mu      sync.Mutex
	objects map[string]*spapi.StoragePool
	rv      int
	main    *managedfields.FieldManager
	status  *managedfields.FieldManager
	writes  []string
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	tc := spacutil.NewTypeConverter(Scheme)
	gvk := spapi.SchemeGroupVersion.WithKind("StoragePool")
	mk := func(sub string) *managedfields.FieldManager {
		fm, err := managedfields.NewDefaultFieldManager(tc, Scheme, Scheme, Scheme, gvk, spapi.SchemeGroupVersion, sub, nil)
		if err != nil {
			t.Fatal(err)
		}
		return fm
	}
	return &fakeAPI{t: t, objects: map[string]*spapi.StoragePool{}, main: mk(""), status: mk("status")}
}

func (f *fakeAPI) apply(fm *managedfields.FieldManager, ac *spac.StoragePoolApplyConfiguration, opts metav1.ApplyOptions, op string) (*spapi.StoragePool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, op+" "+*ac.GetName())
	data, err := json.Marshal(ac)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(data, &u.Object); err != nil {
		return nil, err
	}
	live, exists := f.objects[*ac.GetName()]
	if !exists {
		if op == "apply_status" {
			return nil, apierrors.NewNotFound(spapi.Resource("storagepools"), *ac.GetName())
		}
		live = &spapi.StoragePool{}
		live.SetGroupVersionKind(spapi.SchemeGroupVersion.WithKind("StoragePool"))
	} else {
		live = live.DeepCopy()
	}
	out, err := fm.Apply(live, u, opts.FieldManager, opts.Force)
	if err != nil {
		return nil, err
	}
	obj := out.(*spapi.StoragePool)
	f.rv++
	obj.ResourceVersion = strconv.Itoa(f.rv)
	if !exists {
		obj.UID = types.UID("uid-" + obj.Name)
		obj.Generation = 1
	} else if !equality.Semantic.DeepEqual(obj.Spec, live.Spec) {
		obj.Generation++
	}
	f.objects[obj.Name] = obj
	return obj.DeepCopy(), nil
}

func (f *fakeAPI) Apply(_ context.Context, ac *spac.StoragePoolApplyConfiguration, opts metav1.ApplyOptions) (*spapi.StoragePool, error) {
	return f.apply(f.main, ac, opts, "apply")
}

func (f *fakeAPI) ApplyStatus(_ context.Context, ac *spac.StoragePoolApplyConfiguration, opts metav1.ApplyOptions) (*spapi.StoragePool, error) {
	return f.apply(f.status, ac, opts, "apply_status")
}

func (f *fakeAPI) Delete(_ context.Context, name string, opts metav1.DeleteOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, "delete "+name)
	obj, ok := f.objects[name]
	if !ok {
		return apierrors.NewNotFound(spapi.Resource("storagepools"), name)
	}
	if p := opts.Preconditions; p != nil && p.ResourceVersion != nil && *p.ResourceVersion != obj.ResourceVersion {
		return apierrors.NewConflict(spapi.Resource("storagepools"), name, nil)
	}
	delete(f.objects, name)
	return nil
}

func (f *fakeAPI) Get(name string) *spapi.StoragePool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if obj, ok := f.objects[name]; ok {
		return obj.DeepCopy()
	}
	return nil
}

func (f *fakeAPI) List() []*spapi.StoragePool {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*spapi.StoragePool
	for _, obj := range f.objects {
		out = append(out, obj.DeepCopy())
	}
	slices.SortFunc(out, func(a, b *spapi.StoragePool) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (f *fakeAPI) Mutated(*spapi.StoragePool) {}

func (f *fakeAPI) Deleted(*spapi.StoragePool) {}

// takeWrites returns the writes since the last call.
func (f *fakeAPI) takeWrites() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.writes
	f.writes = nil
	return w
}
