# Write-back of a volume's outputs (pkg/writeback): tests against a real S3 server (versitygw) and
# real overlay mounts.

.PHONY: test-writeback
TEST_TARGETS += test-writeback

# NFS targets are tested against go-nfs and Debian's nfs-ganesha (VFS FSAL) with its rpcbind, both
# in a network namespace the test makes (test/testpeers/ganesha.go).
HOST_PACKAGES += ganesha.nfsd=nfs-ganesha /usr/lib/$(shell uname -m)-linux-gnu/ganesha/libfsalvfs.so=nfs-ganesha-vfs rpcbind=rpcbind

# The write-back's Events (pkg/outputevents) are recorded on a real control plane.
## Write-back tests against versitygw, go-nfs, nfs-ganesha, real overlays and a real API server (Events)
test-writeback: $(VERSITYGW) k8s-tools host-packages
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 \
	  $(GO_TEST) -count=1 -timeout 10m ./pkg/writeback/... ./pkg/outputevents/...

.PHONY: bench-writeback
BENCH_TARGETS += bench-writeback
# The issue's outputs (2 GiB in one file, 100 x 64 MiB, 20,000 x 32 KiB); WRITEBACK_SCALE=n divides
# them for a smaller machine. Figures go to docs/benchmarks.md by hand.
WRITEBACK_SCALE ?= 1
## Write-back upload time vs. rclone and the transfer manager on the same files and server
# First NodeUnpublish's latency with the single file written, through the driver (root): its
# ratio goes on the single file's line.
bench-writeback: s3-tools
	@mkdir -p _output/bench
	CISTERN_WRITEBACK_SCALE=$(WRITEBACK_SCALE) CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 \
	  CISTERN_UNPUBLISH_RATIO_FILE=$(CURDIR)/_output/bench/unpublish-ratio \
	  $(GO) test -tags bench -count=1 -timeout 60m -run '^TestBenchUnpublish$$' -v ./pkg/driver/ | grep -E '^(writeback:|--- |ok|FAIL)|_test.go'; \
	  [ $${PIPESTATUS[0]} = 0 ] || exit 1
	CISTERN_WRITEBACK_SCALE=$(WRITEBACK_SCALE) CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_RCLONE=$(RCLONE) CISTERN_REQUIRE_PEERS=1 \
	  CISTERN_UNPUBLISH_RATIO_FILE=$(CURDIR)/_output/bench/unpublish-ratio \
	  $(GO) test -tags bench -count=1 -timeout 60m -run '^TestBenchWriteback$$' -v ./pkg/writeback/ | grep -E '^(writeback:|--- |ok|FAIL)|_test.go'; exit $${PIPESTATUS[0]}
