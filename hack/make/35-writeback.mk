# Write-back of a volume's outputs (pkg/writeback): tests against a real S3 server (versitygw) and
# real overlay mounts.

.PHONY: test-writeback
TEST_TARGETS += test-writeback

## Write-back tests against versitygw and real overlays
test-writeback: $(VERSITYGW)
	CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 \
	  $(GO_TEST) -count=1 -timeout 10m ./pkg/writeback/...
