package chaos

import "golang.org/x/sys/unix"

type syscallStatfs = unix.Statfs_t

func statfs(path string, st *syscallStatfs) error { return unix.Statfs(path, st) }
