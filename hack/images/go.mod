// The node-level tests' container images: a pause image and a shell-free checker, each a static
// Go binary in an OCI image built locally (no registry, no Docker). Kept out of the root module so
// that the project does not take on go-containerregistry.
module github.com/cistern-csi/cistern/hack/images

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
