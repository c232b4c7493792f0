package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// up starts the demo in the background unless it is running, follows its progress, and shows
// what it made.
func up(d demoDir) error {
	if os.Geteuid() != 0 {
		return errors.New("the demo makes loop devices and mounts: run it as root")
	}
	if pid, ok := running(d); ok {
		fmt.Printf("The demo is already running (pid %d).\n", pid)
		return show(d)
	}
	if err := os.MkdirAll(string(d), 0o755); err != nil {
		return err
	}
	_ = os.Remove(d.progressFile())
	_ = os.Remove(d.summaryFile())
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.Create(d.logFile())
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(self, "serve", "--dir", string(d))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "CISTERN_LOG_DIR="+d.path("logs"), "CISTERN_KEEP_LOGS=true")
	// Its own session: it outlives `make demo` until `make demo-down`.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := os.WriteFile(d.pidFile(), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	fmt.Printf("Starting the Cistern demo in %s (log: %s)\n", d, d.logFile())
	seen := 0
	for {
		lines := readLines(d.progressFile())
		for _, l := range lines[seen:] {
			fmt.Printf("  [%5.1fs] %s\n", time.Since(started).Seconds(), l)
			if strings.HasPrefix(l, "FAILED") {
				return fmt.Errorf("the demo did not start; see %s and the logs in %s", d.logFile(), d.path("logs"))
			}
		}
		seen = len(lines)
		if seen > 0 && lines[seen-1] == "READY" {
			break
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the demo exited (%v); see %s", err, d.logFile())
		case <-time.After(200 * time.Millisecond):
		}
	}
	// The serving process carries on alone.
	_ = cmd.Process.Release()
	return show(d)
}

// running reports the pid of a live demo.
func running(d demoDir) (int, bool) {
	data, err := os.ReadFile(d.pidFile())
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	// After a reboot the pid may belong to another process: it must be our `serve`.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "serve\x00--dir\x00"+string(d)) {
		return 0, false
	}
	return pid, true
}

func readLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	return lines
}

// show prints the screens: pools, a pool-targeted claim, the dataset, the LWS, how to look.
func show(d demoDir) error {
	data, err := os.ReadFile(d.summaryFile())
	if err != nil {
		return fmt.Errorf("no summary yet (%v); is the demo still starting? see %s", err, d.logFile())
	}
	var s summary
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	kubectl := func(args ...string) {
		cmd := exec.Command(s.Kubectl, append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		fmt.Print(indent(string(out)))
		if err != nil {
			fmt.Printf("  (kubectl %s: %v)\n", strings.Join(args, " "), err)
		}
	}
	fmt.Printf("\nThe demo was ready in %s.\n", s.ReadyIn)

	screen("1/5  Storage pools: what each node offers")
	fmt.Println("StoragePool objects, published by the storagepool-sidecar of each node:")
	kubectl("get", "storagepools", "-o", "custom-columns=NAME:.metadata.name,DRIVER:.spec.driver,NODES:.status.accessibleNodes,TOTAL:.status.capacity.total,AVAILABLE:.status.capacity.available")
	fmt.Println("CSIStorageCapacity objects, published per node and StorageClass by the external-provisioner; the scheduler reads them:")
	kubectl("get", "csistoragecapacities", "-n", "cistern-system", "-o", "custom-columns=CLASS:.storageClassName,NODE:.nodeTopology.matchLabels.topology\\.cistern\\.csi\\.dev/node,CAPACITY:.capacity,MAX VOLUME:.maximumVolumeSize")

	screen("2/5  A claim on pool `fast`, bound where its pod was scheduled")
	kubectl("get", "storageclass", "cistern-fast", "-o", "custom-columns=CLASS:.metadata.name,PROVISIONER:.provisioner,BINDING:.volumeBindingMode,PARAMETERS:.parameters")
	kubectl("get", "pvc", "scratch", "-n", s.Namespace, "-o", "custom-columns=CLAIM:.metadata.name,STATUS:.status.phase,SIZE:.spec.resources.requests.storage,VOLUME:.spec.volumeName,SELECTED NODE:.metadata.annotations.volume\\.kubernetes\\.io/selected-node")
	kubectl("get", "pod", "scratch-user", "-n", s.Namespace, "-o", "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,CLAIM:.spec.volumes[0].persistentVolumeClaim.claimName")
	if s.ScratchPV != "" {
		kubectl("get", "pv", s.ScratchPV, "-o", "custom-columns=PV:.metadata.name,CSI VOLUME (pool-id):.spec.csi.volumeHandle,PINNED TO:.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]")
	}

	screen("3/5  A dataset from S3, staged into a volume and verified")
	for _, l := range s.Dataset {
		fmt.Println(l)
	}
	fmt.Println("What each node now holds in its dataset cache, from the StoragePools:")
	kubectl("get", "storagepools", "-o", "custom-columns=NAME:.metadata.name,CACHED:.status.cache.bytes,DATASET:.status.cache.datasets[*].id,STATE:.status.cache.datasets[*].state,SOURCE:.status.cache.datasets[*].source")

	screen("4/5  A LeaderWorkerSet with a claim template")
	kubectl("get", "leaderworkersets,statefulsets", "-n", s.Namespace)
	kubectl("get", "pods", "-n", s.Namespace, "-l", "leaderworkerset.sigs.k8s.io/name=llm", "-o", "wide")
	kubectl("get", "pvc", "-n", s.Namespace, "-l", "leaderworkerset.sigs.k8s.io/name=llm")

	screen("5/5  Look around")
	fmt.Printf("  export KUBECONFIG=%s\n", s.Kubeconfig)
	fmt.Printf("  alias kubectl=%s\n", s.Kubectl)
	fmt.Println("  kubectl get nodes,csinodes,csidriver")
	fmt.Println("  kubectl get pvc,pv -A")
	if s.S3Endpoint != "" {
		fmt.Printf("  S3 server: %s (bucket datasets)\n", s.S3Endpoint)
	}
	fmt.Printf("  component logs: %s\n", s.LogDir)
	for _, w := range s.Warnings {
		fmt.Printf("  note: %s\n", w)
	}
	fmt.Println("\nStop everything and remove every mount and loop device with: make demo-down")
	return nil
}

func screen(title string) {
	fmt.Printf("\n%s\n%s\n", title, strings.Repeat("─", len([]rune(title))))
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}
