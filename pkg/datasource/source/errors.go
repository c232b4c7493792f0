package source

import (
	"context"
	"errors"
	"fmt"
)

// Kind says how a caller should react to an error.
type Kind int

const (
	// Retryable failures (5xx, throttling, resets, timeouts) are retried with backoff; if they
	// persist the staging attempt fails and may be retried later.
	Retryable Kind = iota
	// Invalid is a bad parameter (unknown key, malformed URL, forbidden path).
	Invalid
	// Denied is an authorization failure (403, bad credentials, path outside the allowed roots).
	Denied
	// NotFound is a missing bucket, key, export or path.
	NotFound
	// Unsafe is an entry that would escape the volume (.. segment, absolute path, symlink out).
	Unsafe
	// Changed is an object that no longer matches the manifest (overwritten during staging).
	Changed
	// TooLarge is a dataset bigger than the volume or the pool.
	TooLarge
	// Corrupt is a verification failure (size, MD5, checksum) that persisted across retries.
	Corrupt
	// NoSpace is a pool without room for the dataset, even after evicting unused datasets.
	NoSpace
	// Unverifiable is an object nothing can check: no full-object checksum, and an ETag that is
	// neither its MD5 nor a multipart ETag whose part size is known or matches one inferred (an
	// old server that reports neither checksums nor parts). Refused unless the administrator
	// serves such objects (--unverifiable-objects).
	Unverifiable
)

func (k Kind) String() string {
	switch k {
	case Retryable:
		return "retryable"
	case Invalid:
		return "invalid"
	case Denied:
		return "denied"
	case NotFound:
		return "not found"
	case Unsafe:
		return "unsafe"
	case Changed:
		return "changed"
	case TooLarge:
		return "too large"
	case Corrupt:
		return "corrupt"
	case NoSpace:
		return "no space"
	case Unverifiable:
		return "unverifiable"
	}
	return "unknown"
}

// Error is a classified failure. Messages name the dataset and the cause, never credentials.
type Error struct {
	Kind Kind
	Msg  string
	Err  error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	if e.Msg == "" {
		return e.Err.Error()
	}
	return e.Msg + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds a classified error.
func Errorf(kind Kind, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Wrap classifies err with a message; a nil err stays nil.
func Wrap(kind Kind, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Err: err}
}

// KindOf returns the kind of err. Unclassified errors are retryable, except context cancellation
// which callers check for themselves.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Retryable
}

// IsPermanent reports whether retrying err cannot help without a change of input.
func IsPermanent(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return KindOf(err) != Retryable
}
