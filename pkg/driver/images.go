package driver

import "github.com/cistern-csi/cistern/pkg/image"

// images is what the driver does with volume images and their loop devices. loopImages does it
// with pkg/image; tests wrap it to pause an operation half-way or to make it fail.
type images interface {
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

// loopImages is images over sparse files and loop devices (pkg/image).
type loopImages struct{}

func (loopImages) Create(path string, size int64) error { return image.Create(path, size) }
func (loopImages) CreateFrom(path, src string, size int64) error {
	return image.CreateFrom(path, src, size)
}
func (loopImages) Grow(path string, size int64) error   { return image.Grow(path, size) }
func (loopImages) Size(path string) (int64, error)      { return image.Size(path) }
func (loopImages) Remove(path string) error             { return image.Remove(path) }
func (loopImages) Attach(path string) (string, error)   { return image.Attach(path) }
func (loopImages) Find(path string) (string, error)     { return image.Find(path) }
func (loopImages) Detach(dev string) error              { return image.Detach(dev) }
func (loopImages) RefreshSize(dev string) error         { return image.RefreshSize(dev) }
func (loopImages) DeviceSize(dev string) (int64, error) { return image.DeviceSize(dev) }
