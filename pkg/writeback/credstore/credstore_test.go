package credstore_test

import (
	"bytes"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/writeback/credstore"
)

// open opens a store in dir and forgets its kernel key when the test ends.
func open(t *testing.T, dir string) *credstore.Store {
	t.Helper()
	s, err := credstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = credstore.Drop(dir) })
	return s
}

// TestSealed saves a tenant's keys and finds them in no file of the directory, reads them back
// in a second store of the same directory (a restarted node plugin: the key is the kernel's),
// and after Drop (what a reboot does to the kernel's memory) finds them lost. A file copied to
// another volume's name does not open.
func TestSealed(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if !s.Persistent() {
		t.Fatal("no kernel keyring here: the key would not outlive the process")
	}
	secrets := map[string]string{"accessKeyID": "AKIA-TENANT", "secretAccessKey": "very-secret-tenant-key"}
	if err := s.Save("vol-1", secrets, time.Time{}); err != nil {
		t.Fatal(err)
	}
	assertNotOnDisk(t, dir, "very-secret-tenant-key", "AKIA-TENANT")

	again := open(t, dir)
	got, err := again.Load("vol-1")
	if err != nil || !maps.Equal(got, secrets) {
		t.Fatalf("after a restart: %v, %v; want the saved keys", got, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "vol-1.sealed"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vol-2.sealed"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Load("vol-2"); !errors.Is(err, credstore.ErrLost) {
		t.Errorf("vol-1's file under vol-2's name: %v, want ErrLost", err)
	}

	if err := credstore.Drop(dir); err != nil {
		t.Fatal(err)
	}
	rebooted := open(t, dir)
	if _, err := rebooted.Load("vol-1"); !errors.Is(err, credstore.ErrLost) {
		t.Errorf("after the kernel forgot the key: %v, want ErrLost", err)
	}
	if got, err := rebooted.Load("none"); got != nil || err != nil {
		t.Errorf("nothing saved: %v, %v; want nil (anonymous)", got, err)
	}
}

// TestExpiry: credentials past their expiry are not returned, and their file is gone.
func TestExpiry(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Save("v", map[string]string{"secretAccessKey": "k"}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Expire("v", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load("v"); err != nil {
		t.Fatalf("before the expiry: %v", err)
	}
	if err := s.Expire("v", time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load("v"); !errors.Is(err, credstore.ErrExpired) {
		t.Errorf("after the expiry: %v, want ErrExpired", err)
	}
	if ids, _ := s.IDs(); len(ids) != 0 {
		t.Errorf("expired credentials still on disk: %v", ids)
	}
}

// TestLegacyFilesSealed: the plaintext files of earlier versions are sealed at Open and removed.
func TestLegacyFilesSealed(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "old.json"), []byte(`{"secretAccessKey":"plaintext-legacy-key"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir)
	assertNotOnDisk(t, dir, "plaintext-legacy-key")
	if got, err := s.Load("old"); err != nil || got["secretAccessKey"] != "plaintext-legacy-key" {
		t.Errorf("the legacy file's keys: %v, %v", got, err)
	}
}

// assertNotOnDisk fails if any file under dir holds one of secrets.
func assertNotOnDisk(t *testing.T, dir string, secrets ...string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		for _, s := range secrets {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("%s holds %q in plaintext", p, s)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
