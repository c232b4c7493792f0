package datasource

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// Code chooses the gRPC code for a datasource error, so CSI handlers can return
// status.Error(datasource.Code(err), err.Error()).
//
//	invalid parameter                        InvalidArgument
//	credentials refused, root not allowed    PermissionDenied
//	bucket, key, export missing; unsafe key  FailedPrecondition (fixing the source fixes it)
//	object nothing can check, refused        FailedPrecondition (or --unverifiable-objects)
//	object changed during staging            Aborted (a retry takes a new manifest)
//	dataset larger than the volume           OutOfRange
//	pool full even after eviction            ResourceExhausted
//	transient source failure, corrupt read   Unavailable (kubelet retries)
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded
	}
	if errors.Is(err, context.Canceled) {
		return codes.Canceled
	}
	var e *source.Error
	if !errors.As(err, &e) {
		return codes.Internal
	}
	switch e.Kind {
	case source.Invalid:
		return codes.InvalidArgument
	case source.Denied:
		return codes.PermissionDenied
	case source.NotFound, source.Unsafe, source.Unverifiable:
		return codes.FailedPrecondition
	case source.Changed:
		return codes.Aborted
	case source.TooLarge:
		return codes.OutOfRange
	case source.NoSpace:
		return codes.ResourceExhausted
	}
	return codes.Unavailable
}
