# Fuzz targets of the untrusted inputs (docs/security.md, "Fuzzing"): S3 answers, the peer
# protocol (batch frames, batch requests, `have`), volume parameters, glob filters, state records.
# `make test` runs each for FUZZ_SHORT_TIME after its committed corpus (testdata/fuzz/); `make
# fuzz` for FUZZTIME each. The short budget is a count of inputs, not a duration: with a duration,
# Go 1.26's fuzz coordinator can fail a target that found nothing at the deadline (go.dev/issue/75804,
# fixed in Go 1.27), which CI hit on FuzzRecord.
FUZZ_TARGETS := \
	./pkg/datasource/s3source:FuzzResponses \
	./pkg/datasource/peer:FuzzBatchFrames \
	./pkg/datasource/peer:FuzzBatchRequest \
	./pkg/datasource/peer:FuzzHave \
	./pkg/params:FuzzParse \
	./pkg/datasource/source:FuzzGlob \
	./pkg/state:FuzzRecord
FUZZ_SHORT_TIME ?= 2000x
FUZZTIME ?= 2m

.PHONY: fuzz fuzz-short
TEST_TARGETS += fuzz-short
## Each fuzz target of the untrusted inputs for a few seconds (part of make test)
fuzz-short:
	@GO=$(GO) hack/make/fuzz.sh $@ $(FUZZ_SHORT_TIME) $(FUZZ_TARGETS)
## Each fuzz target for FUZZTIME (default 2m)
fuzz:
	@GO=$(GO) hack/make/fuzz.sh $@ $(FUZZTIME) $(FUZZ_TARGETS)
