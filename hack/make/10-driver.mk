# CSI driver: unit and real-mount tests, csi-sanity, lifecycle benchmark.
TEST_TARGETS += test-driver sanity
BENCH_TARGETS += bench-driver bench-writable

# Packages whose tests need nothing but root, loop devices and mkfs, and the pure ones (fakes, no
# root); test/scrape also needs Debian's prometheus (a real Prometheus scrapes the node plugin
# and the storagepool-sidecar) and the control plane of k8s-tools (which checks the scraper's
# token and permission for the node plugin).
DRIVER_PKGS := ./pkg/driver/... ./pkg/image/... ./pkg/pool/... ./pkg/overlayfs/... ./cmd/csi-driver/... ./test/scrape/...
HOST_PACKAGES += prometheus=prometheus
DRIVER_UNIT_PKGS := ./pkg/consts/... ./pkg/units/... ./pkg/logflags/... ./pkg/ids/... ./pkg/state/... ./pkg/params/... ./pkg/sarole/... ./pkg/startuptaint/... ./pkg/volume/... ./pkg/testpoint/...

.PHONY: test-driver sanity bench-driver bench-writable
## Driver, pool and state tests with real mounts and the S3 server
test-driver: k8s-tools
	$(GO_TEST) -count=1 $(DRIVER_UNIT_PKGS)
	$(GO_TEST) -count=1 $(DRIVER_PKGS)

# The upstream csi-test sanity suite against the real driver on a unix socket. It fails when
# fewer specs pass than test/specgate/expected.txt says; the specs that skip themselves are
# listed as skipped subtests.
## csi-sanity against the real driver
sanity:
	$(GO_TEST) -count=1 -v ./sanity/... ./test/specgate/... | grep -E '^(gate: |--- |ok|FAIL|PASS)|Passed|Failed|Skipped|(specgate|_test)\.go:[0-9]+' ; exit $${PIPESTATUS[0]}

# 100 volumes of 64 MiB through the driver vs. the same steps done directly; CreateVolume with
# 1,000 existing volumes vs. 10. BENCH_DIR should be on the disk you care about.
BENCH_DIR ?= /var/tmp
## Volume lifecycle through the driver vs. the same steps done directly
bench-driver:
	@mkdir -p _output
	set -o pipefail; $(GO) run ./hack/bench/driver -volumes 100 -size 64Mi -scale 1000 -dir $(BENCH_DIR) | tee _output/bench-driver.md

# A new writable volume of a cached dataset (2 GiB and 20 GiB, one file each) made ready layered
# on the cache vs. copied from it (--writable-datasets=copy) and vs. an empty volume, on ext4 and
# xfs pools (pkg/driver/writable_bench_test.go): the 2 GiB case on a pool image under BENCH_DIR
# (about 6 GiB of disk), the 20 GiB one on a zram device (its zeros cost no memory). About 10
# minutes. The last lines (`writable: ...`) go to docs/benchmarks.md by hand; the full log is kept
# in _output/bench-writable.txt.
## Writable dataset volumes: ready layered on the cache vs. copied, ext4 and xfs pools
bench-writable:
	@mkdir -p _output
	CISTERN_BENCH_DIR=$(BENCH_DIR) $(GO) test -tags bench -count=1 -timeout 60m -v -run '^TestWritableReadyBench$$' \
	  ./pkg/driver/ >_output/bench-writable.txt 2>&1; rc=$$?; \
	  grep -E '^(writable: |    writable_bench)' _output/bench-writable.txt; \
	  if [ $$rc -ne 0 ]; then tail -n 40 _output/bench-writable.txt; fi; exit $$rc
