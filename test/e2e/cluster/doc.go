// Package cluster assembles Cistern on a real control plane the way a node DaemonSet would, but
// with each component as a local process: per simulated node, pools on loop-mounted filesystems,
// the CSI driver, the upstream external-provisioner in node-deployment mode with capacity
// tracking, and the storagepool-sidecar; once per cluster, the workload-controller. Components
// authenticate as the ServiceAccounts deploy/csi creates, so they get exactly its RBAC.
//
// The e2e suite (test/e2e) and `make demo` (hack/demo) both use it.
package cluster
