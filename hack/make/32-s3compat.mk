# S3 compatibility (test/s3compat): the same staging, streaming and write-back cases against
# every S3 server we support: versitygw (built by 30-datasource.mk), SeaweedFS (built here from
# the pinned module) and Ceph RGW (Debian's packages: one monitor, one in-memory OSD, radosgw).
# SeaweedFS tags its releases without a "v" (not semver), so the pin is a pseudo-version: the
# master commit of 2026-11-09, whose weed reports version 4.53.
SEAWEEDFS_VERSION := v0.0.0-20261109003541-7506e5f91cd6
SEAWEEDFS := $(CISTERN_CACHE)/seaweedfs-$(SEAWEEDFS_VERSION)/bin/weed
SEAWEEDFS_MOD := hack/tools/seaweedfs

.PHONY: seaweedfs test-s3-compat bench-datasource-servers
TEST_TARGETS += test-s3-compat

## Builds SeaweedFS's weed into the cache
seaweedfs: $(SEAWEEDFS)
$(SEAWEEDFS):
	cd $(SEAWEEDFS_MOD) && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@ github.com/seaweedfs/seaweedfs/weed

# radosgw and the Ceph daemons come from Debian (bookworm: 16.2.15); .ci/run installs them.
HOST_PACKAGES += radosgw=radosgw ceph-mon=ceph-mon ceph-osd=ceph-osd ceph=ceph-common
## S3 compatibility cases (staged, streaming, hostile keys, changes, multipart, corruption, write-back) against versitygw, SeaweedFS and Ceph RGW
test-s3-compat: $(VERSITYGW) $(SEAWEEDFS) host-packages
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_SEAWEEDFS=$(SEAWEEDFS) CISTERN_REQUIRE_PEERS=1 \
	  $(GO_TEST) -count=1 -timeout 20m ./test/s3compat/

# Dataset staging from each S3 server (docs/benchmarks.md, "Dataset staging"): Cistern and rclone
# stage 100 x 8 MiB from versitygw, SeaweedFS and Ceph RGW in turn, 3 runs each, every copy
# checked byte for byte; one `datasource-server:` line per server and copier (min, median, max,
# and Cistern / rclone). Here, not in 30-datasource.mk, as it needs $(SEAWEEDFS). A few minutes
# per server (RGW's start included).
BENCH_TARGETS += bench-datasource-servers
## Dataset staging vs. rclone from each S3 server: versitygw, SeaweedFS, Ceph RGW
bench-datasource-servers: $(VERSITYGW) $(RCLONE) $(SEAWEEDFS) host-packages
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_SEAWEEDFS=$(SEAWEEDFS) CISTERN_RCLONE=$(RCLONE) CISTERN_REQUIRE_PEERS=1 \
	  $(GO) test -count=1 -timeout 60m -run '^$$' -bench '^BenchmarkStagingServers$$' -benchtime 1x -v ./pkg/datasource/bench/
bench-datasource: bench-datasource-servers
