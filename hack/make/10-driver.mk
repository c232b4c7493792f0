# CSI driver: unit and real-mount tests, csi-sanity, lifecycle benchmark.
TEST_TARGETS += test-driver sanity
BENCH_TARGETS += bench-driver

# Packages whose tests need nothing but root, loop devices and mkfs; the pure ones (fakes, no
# root) run under the race detector.
DRIVER_PKGS := ./pkg/driver/... ./pkg/image/... ./pkg/pool/... ./cmd/csi-driver/...
DRIVER_UNIT_PKGS := ./pkg/consts/... ./pkg/ids/... ./pkg/state/... ./pkg/params/... ./pkg/volume/...

.PHONY: test-driver sanity bench-driver
## Driver, pool and state tests with real mounts and the S3 server
test-driver:
	$(GO_TEST) -count=1 $(RACE) $(DRIVER_UNIT_PKGS)
	$(GO_TEST) -count=1 $(DRIVER_PKGS)

# The upstream csi-test sanity suite against the real driver on a unix socket.
## csi-sanity against the real driver
sanity:
	$(GO_TEST) -count=1 -v ./sanity/... | grep -E '^(--- |ok|FAIL|PASS)|Passed|Failed|Skipped' ; exit $${PIPESTATUS[0]}

# 100 volumes of 64 MiB through the driver vs. the same steps done directly; CreateVolume with
# 1,000 existing volumes vs. 10. BENCH_DIR should be on the disk you care about.
BENCH_DIR ?= /var/tmp
## Volume lifecycle through the driver vs. the same steps done directly
bench-driver:
	@mkdir -p _output
	$(GO) run ./hack/bench/driver -volumes 100 -size 64Mi -scale 1000 -dir $(BENCH_DIR) | tee _output/bench-driver.md
