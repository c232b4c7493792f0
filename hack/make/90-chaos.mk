# Fault suite (test/chaos): the driver process staging datasets under injected S3 faults, a full
# pool and SIGKILLs at named points inside staging, publishing and unpublishing (seeded:
# CHAOS_SEED), then CHAOS_LOAD dataset volumes over CHAOS_LOAD_DATASETS datasets published at once
# on one node, the first GET of every object faulted. Ends with the lines `chaos: rounds=…
# faults_delivered=… kills_mid_call=… corrupted=… leaked=…` and `load: volumes=… datasets=… …
# errors=…`; it fails on any corrupted volume, leak, fault not delivered, unclear failure or load
# error, and on fewer delivered faults or mid-call kills than CHAOS_MIN_FAULTS and
# CHAOS_MIN_KILLS. Under CI=true the driver is built with -race, and a race report in its log
# fails the run (CISTERN_RACE_BINARIES=1 does it elsewhere). `make test` runs the bounded part
# (chaos-short: every fault once, 50 volumes over 5 datasets).
CHAOS_SEED ?= 1
CHAOS_ROUNDS ?= 44
CHAOS_LOAD ?= 200
CHAOS_LOAD_DATASETS ?= 20
CHAOS_MIN_FAULTS ?= 20
CHAOS_MIN_KILLS ?= 20
.PHONY: chaos chaos-short
# The lines kept: the tests' own, and their logs' continuation lines (a race report the driver
# wrote, which the test quotes).
## The fault suite: staging under injected S3 faults, a full pool, SIGKILLs, then load
chaos: $(VERSITYGW)
	@CISTERN_VERSITYGW=$(VERSITYGW) CISTERN_REQUIRE_PEERS=1 CISTERN_CHAOS_SEED=$(CHAOS_SEED) \
	  CISTERN_CHAOS_ROUNDS=$(CHAOS_ROUNDS) CISTERN_CHAOS_LOAD=$(CHAOS_LOAD) \
	  CISTERN_CHAOS_LOAD_DATASETS=$(CHAOS_LOAD_DATASETS) CISTERN_CHAOS_MIN_FAULTS=$(CHAOS_MIN_FAULTS) \
	  CISTERN_CHAOS_MIN_KILLS=$(CHAOS_MIN_KILLS) \
	  $(GO_TEST) -count=1 -timeout 90m -v -run TestChaos ./test/chaos/ | \
	  grep -E '^(gate: |--- |ok|FAIL|PASS|panic|chaos: |load: |        )|_test.go:[0-9]+' ; exit $${PIPESTATUS[0]}

TEST_TARGETS += chaos-short
## The bounded fault suite of make test (every fault once, 50 volumes over 5 datasets)
chaos-short:
	@$(MAKE) --no-print-directory chaos CHAOS_ROUNDS=11 CHAOS_LOAD=50 CHAOS_LOAD_DATASETS=5 \
	  CHAOS_MIN_FAULTS=10 CHAOS_MIN_KILLS=5
