// Package standins holds stand-ins for the upstream CSI sidecars that the install suite
// (test/e2einstall) cannot pull or build here: node-driver-registrar and livenessprobe. Each is a
// command with the upstream flags the manifests in deploy/csi pass (and those they default),
// doing the upstream job with this project's code, so that the suite applies the manifests
// unchanged. They are test fixtures, never shipped: users run the upstream images the
// manifests name. See docs/testing.md ("Stand-ins").
package standins
