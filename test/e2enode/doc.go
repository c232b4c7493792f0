// Package e2enode runs Cistern on a real one-node cluster on this machine: the control plane of
// test/framework, kubelet, containerd and runc built from source (`make kubelet-tools
// node-tools`), the driver registered through kubelet's plugin watcher (by the node-driver-registrar
// stand-in, as the registrar container does), and external-provisioner
// in node-deployment mode. Pods run images built locally (hack/images): no registry is contacted.
//
// Everything lives in a private directory: kubelet's --root-dir, containerd's root, state and
// socket, the pool. The suite's cleanup kills the containers, stops the processes, unmounts
// everything under that directory and detaches the loop devices backed by files in it, also
// when a test fails. Pods use the host network and write their results to a hostPath directory
// the test reads: no kubectl logs or exec, which would need the API server to reach kubelet.
package e2enode
