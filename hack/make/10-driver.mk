# CSI driver: unit tests and csi-sanity.
TEST_TARGETS += test-unit sanity

sanity:
	$(GO) test -count=1 -v ./sanity/... 2>&1 | tail -n 200
