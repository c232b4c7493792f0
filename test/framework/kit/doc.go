// Package kit is the part of Cistern's test kit that needs no Kubernetes client, so that unit
// tests and the data-plane peers (test/testutil, test/testpeers) use it without linking client-go:
// TB, free loopback ports, the repository root and Eventually. test/framework re-exports it.
package kit
