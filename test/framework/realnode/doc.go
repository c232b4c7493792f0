// Package realnode runs real Kubernetes nodes on this machine for the node-level suites
// (test/e2enode): containerd and runc (`make node-tools`), kubelet (`make kubelet-tools`) with a
// node CA of its own, Cistern's driver with a loop-mounted pool, external-provisioner in
// node-deployment mode, nodes in network namespaces of their own, a git server for the notebook
// scenarios, and the cleanup that leaves the host as it was (mounts, loop devices, cgroups), also
// when a test fails. It works with the control plane of test/framework; like it, it is a package
// any suite (or hack/demo) can use, not test files of one suite.
package realnode
