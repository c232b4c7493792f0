package poolpublisher

import (
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
)

func pool(name, rv, uid string) *spapi.StoragePool {
	p := &spapi.StoragePool{}
	p.Name, p.ResourceVersion, p.UID = name, rv, types.UID(uid)
	return p
}

// TestObjectCacheOverlay checks that the sidecar sees its own writes before its informer does,
// and sees deletions (its own and others') at once.
func TestObjectCacheOverlay(t *testing.T) {
	inf := NewInformer(nil, labels.Everything()) // never started: the test fills its store
	c, err := NewObjectCache(inf)
	if err != nil {
		t.Fatal(err)
	}
	notified := 0
	c.OnDelete(func() { notified++ })
	store := inf.GetStore()
	rv := func(p *spapi.StoragePool) string {
		if p == nil {
			return "<nil>"
		}
		return p.ResourceVersion
	}

	c.Mutated(pool("a", "5", "u1"))
	if got := c.Get("a"); rv(got) != "5" {
		t.Errorf("own write not yet in the informer: got %s, want 5", rv(got))
	}
	if n := len(c.List()); n != 1 {
		t.Errorf("List has %d objects, want 1", n)
	}
	_ = store.Add(pool("a", "3", "u1"))
	if got := c.Get("a"); rv(got) != "5" {
		t.Errorf("informer behind the own write: got %s, want 5", rv(got))
	}
	_ = store.Update(pool("a", "7", "u1"))
	if got := c.Get("a"); rv(got) != "7" {
		t.Errorf("informer caught up: got %s, want 7", rv(got))
	}

	c.Deleted(pool("a", "7", "u1"))
	if got := c.Get("a"); got != nil {
		t.Errorf("own delete not yet in the informer: got %s, want none", rv(got))
	}
	_ = store.Update(pool("a", "9", "u2")) // re-created by someone else
	if got := c.Get("a"); rv(got) != "9" {
		t.Errorf("a new object of the same name: got %s, want 9", rv(got))
	}

	c.Mutated(pool("b", "10", "u3"))
	c.deleteHandler(pool("b", "11", "u3")) // deleted by someone else
	if got := c.Get("b"); got != nil || notified != 1 {
		t.Errorf("after a deletion event: got %s, notified %d times; want none, once", rv(got), notified)
	}
}
