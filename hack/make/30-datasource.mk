# Dataset staging (pkg/datasource): tests against a real S3 server (versitygw), a userspace NFS
# server, real mounts; a benchmark against rclone, the AWS SDK's transfer manager, awscli and cp -r.
VERSITYGW_VERSION := v1.8.0
RCLONE_VERSION := v1.76.0
# Static (no cgo): the same binary runs on the host and in the install suite's S3 server image.
VERSITYGW := $(CISTERN_CACHE)/versitygw-$(VERSITYGW_VERSION)/bin/versitygw-static
RCLONE := $(CISTERN_CACHE)/rclone-$(RCLONE_VERSION)/bin/rclone
S3_TOOLS_MOD := hack/tools/s3

# Debian's awscli (not whatever `aws` is first on the PATH): the benchmark's peer only.
AWSCLI := /usr/bin/aws

.PHONY: s3-tools test-datasource bench-datasource bench-glob
TEST_TARGETS += test-datasource
BENCH_TARGETS += bench-datasource bench-glob

## Builds versitygw and rclone into the cache
s3-tools: $(VERSITYGW) $(RCLONE)

# Built from the pinned tools module once per version; later runs find them in the cache.
$(VERSITYGW):
	cd $(S3_TOOLS_MOD) && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@ github.com/versity/versitygw/cmd/versitygw
$(RCLONE):
	cd $(S3_TOOLS_MOD) && $(GO) build -o $@ github.com/rclone/rclone

# Tests need the S3 server, and a control plane for the node Events (nodeevents); rclone is
# the benchmark's peer. NFSv4 staging (nfs4source) is tested against nfs-ganesha's NFSv4 export
# through libnfs: GOFLAGS has -tags=libnfs (Makefile), HOST_PACKAGES libnfs-dev and ganesha. Streaming volumes (streamfs, and the keeper that holds their FUSE
# connections) read from the same server through the real kernel's FUSE.
## Dataset staging and streaming tests against versitygw, go-nfs, nfs-ganesha (NFSv4), real mounts and FUSE
test-datasource: $(VERSITYGW) k8s-tools
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 \
	  $(GO_TEST) -count=1 -timeout 15m ./pkg/datasource/... ./pkg/nodeevents/... ./pkg/peerdirectory/... ./pkg/streamfs/... ./pkg/fusekeeper/...

# The benchmark runs `aws s3 cp` from Debian's awscli; installed where the benchmark runs, not for
# make test.
## Dataset staging vs. rclone, the transfer manager, awscli and cp -r
bench-datasource: HOST_PACKAGES += $(AWSCLI)=awscli
# Figures go to docs/benchmarks.md ("Dataset staging" section) by hand from the printed table.
# Every copier is required: a missing or failing one fails the benchmark. It also runs
# bench-datasource-servers (32-s3compat.mk): the same staging from each S3 server against rclone.
bench-datasource: s3-tools host-packages
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_RCLONE=$(RCLONE) CISTERN_AWSCLI=$(AWSCLI) CISTERN_REQUIRE_PEERS=1 \
	  $(GO) test -count=1 -timeout 60m -run '^$$' -bench '^BenchmarkStaging$$' -benchtime 1x -v ./pkg/datasource/bench/

# The driver's dataset tests (pkg/driver/dataset_test.go) need the S3 server too.
test-driver: $(VERSITYGW)
test-driver: export CISTERN_VERSITYGW := $(VERSITYGW)
test-driver: export CISTERN_REQUIRE_PEERS := 1

# Include/exclude matching at its worst: many "**" against a deep key that does not match.
## Include/exclude matching at its worst case
bench-glob:
	$(GO) test -count=1 -run '^$$' -bench BenchmarkFilterWorstCase ./pkg/datasource/source/

# Peer fan-out (docs/benchmarks.md, "Peer fan-out"): 4 and 8 simulated nodes, each a process with
# its own pool filesystem, staging one dataset from versitygw behind a 200 MB/s proxy, with and
# without peers, plus a late node. Ends with one `fanout:` line per case. Needs root (loop
# devices) and about 20 GB of free disk for the 2 GiB set with 8 nodes.
BENCH_TARGETS += bench-fanout
.PHONY: bench-fanout
## Peer fan-out on 4 and 8 simulated nodes, with and without peers
bench-fanout: $(VERSITYGW)
	CISTERN_VERSITYGW=$(VERSITYGW) \
	  $(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkFanout -benchtime 1x -v ./pkg/datasource/bench/

# The access proof's cost on 20,000 × 32 KiB (docs/security.md): a first hit and a remembered
# hit as fractions of staging, 3 runs.
BENCH_TARGETS += bench-access-proof
.PHONY: bench-access-proof
## The access proof at 20,000 x 32 KiB: first and remembered hit as fractions of staging
bench-access-proof: $(VERSITYGW)
	CISTERN_VERSITYGW=$(VERSITYGW) \
	  $(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkAccessProof -benchtime 1x -v ./pkg/datasource/bench/

# The node plugin's peak memory and CPU under a listing flood (docs/security.md): what
# deploy/csi's limits must hold.
BENCH_TARGETS += bench-listing-flood
.PHONY: bench-listing-flood
## The node plugin's peak memory under a listing flood
bench-listing-flood:
	$(GO) test -count=1 -timeout 30m -run '^$$' -bench BenchmarkListingFlood -benchtime 1x -v ./pkg/datasource/bench/

BENCH_TARGETS += bench-streaming
.PHONY: bench-streaming
# Streaming volumes (docs/datasets.md "Streaming volumes"). First the mount alone (pkg/streamfs:
# the first byte of an uncached 1 GiB object against one ranged GET of it and one GET of the part
# it must check; per-part checksums brought by the bench, as versitygw reports none;
# BENCH_STREAM_CASES=parts,whole,readall for the other cases), then the issue's cases through the driver
# (pkg/driver/stream_bench_test.go): datasets of 2 GiB, 100 x 64 MiB, 20,000 x 32 KiB and 20 GiB
# on a zram device, against the full staging, `rclone mount --vfs-cache-mode full` (it needs
# fusermount3) and the pool read directly. About 30 minutes. Knobs: CISTERN_BENCH_STREAM_DATASETS
# (model-2g,shards-100x64m,small-20000x32k,model-20g), CISTERN_BENCH_SAMPLES (3),
# CISTERN_BENCH_STREAM_20G_READ=1 (also read the 20 GiB set whole), CISTERN_BENCH_STREAM_RCLONE=0.
# The `streaming: ` lines go to docs/benchmarks.md by hand; the full log is kept in
# _output/bench-streaming.txt. Needs root, /dev/fuse and zram.
BENCH_STREAM_CASES ?= parts
bench-streaming: HOST_PACKAGES += fusermount3=fuse3
## Streaming volumes: publish, first byte, read all, cached reads vs staging, rclone mount, the pool
bench-streaming: $(VERSITYGW) $(RCLONE) host-packages
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 CISTERN_BENCH_STREAM_CASES=$(BENCH_STREAM_CASES) \
	  $(GO) test -count=1 -timeout 30m -run '^$$' -bench BenchmarkStreamingFirstByte -benchtime 1x ./pkg/streamfs/
	@mkdir -p _output
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_RCLONE=$(RCLONE) CISTERN_REQUIRE_PEERS=1 \
	  $(GO) test -tags bench -count=1 -timeout 90m -v -run '^TestStreamingBench$$' ./pkg/driver/ \
	  >_output/bench-streaming.txt 2>&1; rc=$$?; \
	  grep -E '^(streaming: |  streaming_samples: )' _output/bench-streaming.txt; \
	  if [ $$rc -ne 0 ]; then tail -n 40 _output/bench-streaming.txt; fi; exit $$rc
