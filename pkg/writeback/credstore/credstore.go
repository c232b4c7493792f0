// Package credstore keeps the credentials an upload of a volume's outputs needs after the pod,
// and its Secret, are gone (docs/security.md, "Write-back"): one file per volume, sealed with
// AES-256-GCM under a key that is never on disk.
//
// The key is held in the kernel's memory: a "user" key in root's user keyring, which outlives
// the node plugin's process but not the node. A restarted or upgraded plugin (a DaemonSet
// rollout, a crash) finds it again and resumes its uploads; after a reboot the files are
// unreadable (ErrLost) and the uploads that needed them wait for their age limit. Why the kernel
// and not the plugin's own memory: kubelet hands credentials over only at NodePublishVolume and
// NodeStageVolume, never at the NodeUnpublishVolume or NodeUnstageVolume that start an upload,
// so a key that died with the process would lose every upload under way at each upgrade. Where
// the kernel has no keyrings (CONFIG_KEYS off, a seccomp profile that refuses add_key), the key
// is the process's own, and a restart loses them too (Persistent says which).
package credstore

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/atomicfile"
)

var (
	// ErrLost is Load's error for credentials sealed under a key the kernel no longer holds
	// (the node restarted since), or a file that is not what Save wrote.
	ErrLost = errors.New("the credentials kept for it are lost: they were sealed with a key held in the node's memory, which a reboot clears")
	// ErrExpired is Load's error for credentials past the expiry they were saved with; the file
	// is removed.
	ErrExpired = errors.New("the credentials kept for it expired")
)

// keyPerm lets root alone (possessor and user: a restarted plugin possesses nothing yet) view,
// read, write, search, link and set attributes of the key; group and others nothing.
const keyPerm = 0x3f3f0000

// suffix names the sealed files; legacy names the plaintext ones of earlier versions.
const (
	suffix = ".sealed"
	legacy = ".json"
)

// Store is a directory of sealed credentials, one file per volume ID.
type Store struct {
	dir        string
	aead       cipher.AEAD
	persistent bool
}

// sealed is a file's content. Expires (RFC 3339, "" for none) is authenticated with the volume
// ID: a file moved to another volume's name, or given a later expiry, does not open.
type sealed struct {
	Expires string `json:"expires,omitempty"`
	Nonce   []byte `json:"nonce"`
	Data    []byte `json:"data"`
}

// Open opens dir (made when missing), gets the key its files are sealed with from the kernel
// (made the first time), and seals the plaintext files of earlier versions.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, persistent, err := kernelKey(dir)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, aead: aead, persistent: persistent}
	return s, s.sealLegacy()
}

// Persistent says whether the key outlives the process (the kernel holds it).
func (s *Store) Persistent() bool { return s.persistent }

func (s *Store) path(id string) string { return filepath.Join(s.dir, id+suffix) }

func aad(id, expires string) []byte {
	return []byte("cistern-writeback-credentials\x00" + id + "\x00" + expires)
}

// Save seals secrets for volume id, replacing what was saved; a zero expires never expires.
func (s *Store) Save(id string, secrets map[string]string, expires time.Time) error {
	plain, err := json.Marshal(secrets)
	if err != nil {
		return err
	}
	rec := sealed{Nonce: make([]byte, s.aead.NonceSize())}
	if !expires.IsZero() {
		rec.Expires = expires.UTC().Format(time.RFC3339)
	}
	if _, err := rand.Read(rec.Nonce); err != nil {
		return err
	}
	rec.Data = s.aead.Seal(nil, rec.Nonce, plain, aad(id, rec.Expires))
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(id), ".creds-", func(f *os.File) error {
		_, err := f.Write(data)
		return err
	}); err != nil {
		return err
	}
	return atomicfile.SyncDir(s.dir)
}

// Load opens volume id's credentials: nil for none saved (an anonymous volume), ErrLost or
// ErrExpired when they cannot be had.
func (s *Store) Load(id string) (map[string]string, error) {
	data, err := os.ReadFile(s.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec sealed
	if json.Unmarshal(data, &rec) != nil || len(rec.Nonce) != s.aead.NonceSize() {
		return nil, ErrLost
	}
	if rec.Expires != "" {
		at, err := time.Parse(time.RFC3339, rec.Expires)
		if err != nil || !time.Now().Before(at) {
			_ = s.Remove(id)
			return nil, ErrExpired
		}
	}
	plain, err := s.aead.Open(nil, rec.Nonce, rec.Data, aad(id, rec.Expires))
	if err != nil {
		return nil, ErrLost
	}
	var m map[string]string
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, ErrLost
	}
	return m, nil
}

// Expire seals volume id's credentials again with the expiry at; none saved is no error.
func (s *Store) Expire(id string, at time.Time) error {
	if _, err := os.Stat(s.path(id)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	m, err := s.Load(id)
	if err != nil {
		return err
	}
	return s.Save(id, m, at)
}

// Remove deletes volume id's credentials; none is no error.
func (s *Store) Remove(id string) error {
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// IDs lists the volumes with credentials saved.
func (s *Store) IDs() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), suffix); ok && e.Type().IsRegular() {
			out = append(out, id)
		}
	}
	return out, nil
}

// sealLegacy seals, and then removes, the plaintext <id>.json files earlier versions kept.
func (s *Store) sealLegacy() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), legacy)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(s.dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var m map[string]string
		if json.Unmarshal(data, &m) == nil {
			if err := s.Save(id, m, time.Time{}); err != nil {
				return err
			}
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return nil
}

// Drop makes every file of dir unreadable, as a reboot does: the kernel forgets its key. None
// held is no error.
func Drop(dir string) error {
	id, err := unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "user", keyName(dir), 0)
	if errors.Is(err, unix.ENOKEY) || errors.Is(err, unix.ENOSYS) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0)
	return err
}

// keyName is the description of dir's key in the keyring: one key per directory.
func keyName(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	sum := sha256.Sum256([]byte(abs))
	return "cistern-writeback-credentials:" + hex.EncodeToString(sum[:16])
}

// kernelKey returns dir's key from root's user keyring, made there the first time; a key of the
// process's own (persistent false) where the kernel has no keyrings. A lock file in dir keeps two
// processes (an upgrade's old and new plugin) from each making one: add_key replaces a key of
// the same name, which would make the other's files unreadable.
func kernelKey(dir string) (key []byte, persistent bool, err error) {
	lock, err := os.OpenFile(filepath.Join(dir, ".key.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, false, err
	}
	name := keyName(dir)
	id, err := unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "user", name, 0)
	if err == nil {
		key = make([]byte, 64)
		n, err := unix.KeyctlBuffer(unix.KEYCTL_READ, id, key, 0)
		if err != nil {
			return nil, false, fmt.Errorf("reading the credentials key from the kernel keyring: %w", err)
		}
		if n == 32 {
			return key[:32], true, nil
		}
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, false, err
	}
	id, err = unix.AddKey("user", name, key, unix.KEY_SPEC_USER_KEYRING)
	if err != nil {
		return key, false, nil // no keyrings here: the process's own key
	}
	if err := unix.KeyctlSetperm(id, keyPerm); err != nil {
		return nil, false, fmt.Errorf("restricting the credentials key: %w", err)
	}
	return key, true, nil
}
