// Package framework runs a real Kubernetes control plane for Cistern's tests.
//
// StartControlPlane starts etcd and kube-apiserver (and, on request, kube-controller-manager and
// kube-scheduler) built from source by `make k8s-tools`, each on free loopback ports with its data
// in a temporary directory, so tests can run in parallel. Everything a test starts is stopped by
// t.Cleanup, also when the test fails; the components' logs are kept under
// _output/logs/<TestName>/ when it fails.
//
// Suites with many tests share one control plane per package with RunShared in TestMain and
// Shared in each test; tests then isolate themselves with CreateNamespace.
package framework
