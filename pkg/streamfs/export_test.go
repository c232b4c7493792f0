package streamfs

// ServeEveryRead makes the mount answer opens without passthrough, as on a kernel without it:
// every read then reaches Read.
func ServeEveryRead(mt *Mount) { mt.opens.noPassthrough.Store(true) }
