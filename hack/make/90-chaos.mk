# Fault suite (test/chaos): the driver process staging datasets under injected S3 faults, a full
# pool and SIGKILLs at random points of staging, publishing and unpublishing (seeded:
# CHAOS_SEED), then 200 dataset volumes published at once on one node. Ends with the lines
# `chaos: rounds=… corrupted=… leaked=…` and `load: volumes=… p50_s=… p99_s=… errors=…`;
# it fails on any corrupted volume, leak, unclear failure or load error. `make test` runs the
# bounded part (chaos-short: every fault once, 50 volumes).
CHAOS_SEED ?= 1
CHAOS_ROUNDS ?= 44
CHAOS_LOAD ?= 200
.PHONY: chaos chaos-short
## The fault suite: staging under injected S3 faults, a full pool, SIGKILLs, then load
chaos: $(VERSITYGW)
	@CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 CISTERN_CHAOS_SEED=$(CHAOS_SEED) \
	  CISTERN_CHAOS_ROUNDS=$(CHAOS_ROUNDS) CISTERN_CHAOS_LOAD=$(CHAOS_LOAD) \
	  $(GO_TEST) -count=1 -timeout 90m -v -run TestChaos ./test/chaos/ | \
	  grep -E '^(gate: |--- |ok|FAIL|PASS|panic|chaos: |load: )|_test.go:[0-9]+' ; exit $${PIPESTATUS[0]}

TEST_TARGETS += chaos-short
## The bounded fault suite of make test (every fault once, 50 volumes)
chaos-short:
	@$(MAKE) --no-print-directory chaos CHAOS_ROUNDS=11 CHAOS_LOAD=50
