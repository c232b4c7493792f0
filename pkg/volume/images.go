package volume

import "github.com/cistern-csi/cistern/pkg/image"

// Images is what the service does with volume images and their loop devices. LoopImages does it
// with pkg/image; tests wrap it to pause an operation half-way, or fake it.
type Images interface {
	Create(path string, size int64) error
	CreateFrom(path, src string, size int64) error
	Grow(path string, size int64) error
	Size(path string) (int64, error)
	Remove(path string) error
	Attach(path string) (string, error)
	Find(path string) (string, error)
	Detach(dev string) error
	RefreshSize(dev string) error
	DeviceSize(dev string) (int64, error)
}

// LoopImages is Images over sparse files and loop devices (pkg/image).
type LoopImages struct{}

func (LoopImages) Create(path string, size int64) error { return image.Create(path, size) }
func (LoopImages) CreateFrom(path, src string, size int64) error {
	return image.CreateFrom(path, src, size)
}
func (LoopImages) Grow(path string, size int64) error   { return image.Grow(path, size) }
func (LoopImages) Size(path string) (int64, error)      { return image.Size(path) }
func (LoopImages) Remove(path string) error             { return image.Remove(path) }
func (LoopImages) Attach(path string) (string, error)   { return image.Attach(path) }
func (LoopImages) Find(path string) (string, error)     { return image.Find(path) }
func (LoopImages) Detach(dev string) error              { return image.Detach(dev) }
func (LoopImages) RefreshSize(dev string) error         { return image.RefreshSize(dev) }
func (LoopImages) DeviceSize(dev string) (int64, error) { return image.DeviceSize(dev) }
