package streamfs

import "container/list"

// backing is a file's registration with the kernel as a passthrough backing file
// (FUSE_DEV_IOC_BACKING_OPEN, go-fuse's RegisterBackingFd): from it on, the kernel holds the file
// open itself, whatever becomes of this process's descriptor. So it counts against the OpenFiles
// bound as one open file, and the bound drops the least recently used idle ones: a file passed
// through once no longer stays open in the kernel for the life of the mount (20,000 files
// opened once were 20,000 more open files in the kernel, under a bound of 64).
//
// When the kernel lets go, measured on Linux 6.18 with go-fuse v2.12.1:
//   - a registration dropped (BACKING_CLOSE) while a file opened with it is open leaves that
//     open reading: the kernel's inode holds the backing file itself until its last open closes;
//   - but every other open of that file meanwhile fails with EIO, answered with the dropped ID
//     or with a new registration of the same file (an open inode has one backing file);
//   - by the time the server hears an open's RELEASE the kernel has let go of the inode's
//     backing file: a new registration answered to the next open works (2,000 of 2,000), and
//     an open the kernel fails after the answer is released too.
//
// So a registration is not dropped right after the open it was made for, but only while every
// open answered with it is released: it is then idle, as an unused descriptor (handle), and
// dropped when the bound needs room. go-fuse's fs package likewise drops a registration at its
// last release (rawBridge.releaseBackingIDRef); this package answers the kernel through the raw
// API, so it keeps the count itself. Opens the pods hold are beyond the bound, as descriptors in
// use are: each is one of the pod's own open files.
type backing struct {
	o     *OpenFiles
	drop  func(id int32) // unregisters id (records it first)
	id    int32          // 0: not registered
	opens int            // opens answered with id that the kernel has not released
	elem  *list.Element  // in o.idle while registered and not open
	// pinned: registered by an earlier process, whose opens no one can count: never dropped.
	pinned bool
	gone   bool // the connection ended, and the kernel's registrations with it
}

// open counts one more open answered with the registration and returns its ID; 0 when the file
// is not registered (never yet, or dropped by the bound). b may be nil: never registered.
func (b *backing) open() int32 {
	if b == nil {
		return 0
	}
	o := b.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.id == 0 || b.gone {
		return 0
	}
	if b.elem != nil {
		o.idle.Remove(b.elem)
		b.elem = nil
	}
	b.opens++
	return b.id
}

// adopt puts registration id, just made for an open, under the bound, counting that open.
func (b *backing) adopt(id int32) {
	o := b.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.gone {
		return
	}
	o.evictLocked(1)
	b.id, b.opens = id, 1
	o.open++
}

// pin puts a registration an earlier process made under the bound, for the life of the mount.
func (o *OpenFiles) pin(id int32) *backing {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.open++
	return &backing{o: o, id: id, pinned: true}
}

// release ends one open answered with the registration; after the last, it is idle.
func (b *backing) release() {
	o := b.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.opens == 0 {
		return
	}
	if b.opens--; b.opens > 0 || b.id == 0 || b.pinned || b.gone {
		return
	}
	b.elem = o.idle.PushBack(b)
	// Back under the bound after a time when more were open than it allows.
	o.evictLocked(0)
}

// closeLocked drops the registration (the bound needs room, or the connection ended).
func (b *backing) closeLocked() {
	if b.elem != nil {
		b.o.idle.Remove(b.elem)
		b.elem = nil
	}
	if b.id == 0 {
		return
	}
	if !b.gone {
		b.drop(b.id)
	}
	b.id = 0
	b.o.open--
}

// end: the connection ended; the kernel dropped its registrations with it.
func (b *backing) end() {
	o := b.o
	o.mu.Lock()
	defer o.mu.Unlock()
	b.gone = true
	b.closeLocked()
}
