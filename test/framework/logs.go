package framework

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

const (
	// LogDirEnv overrides the root under which component logs are written (default:
	// <repository>/_output/logs).
	LogDirEnv = "CISTERN_LOG_DIR"
	// KeepLogsEnv set to "true" keeps logs of passing tests too.
	KeepLogsEnv = "CISTERN_KEEP_LOGS"
)

var (
	logDirsMu sync.Mutex
	logDirs   = map[TB]string{}
)

// LogDir returns the directory where the processes a test starts write their logs,
// _output/logs/<TestName>/. It is emptied when first used by a test, removed when the test passes
// and kept, with its path logged, when it fails.
func LogDir(t TB) string {
	t.Helper()
	logDirsMu.Lock()
	defer logDirsMu.Unlock()
	if dir, ok := logDirs[t]; ok {
		return dir
	}
	dir, err := newLogDir(t.Name())
	if err != nil {
		t.Fatalf("creating log directory: %v", err)
	}
	logDirs[t] = dir
	// Registered before any process cleanup, so it runs after all of them.
	t.Cleanup(func() {
		logDirsMu.Lock()
		delete(logDirs, t)
		logDirsMu.Unlock()
		finishLogDir(dir, t.Failed(), t.Logf)
	})
	return dir
}

// newLogDir creates an empty log directory for a test (or TestMain) name.
func newLogDir(name string) (string, error) {
	root := os.Getenv(LogDirEnv)
	if root == "" {
		repo, err := repoRoot()
		if err != nil {
			return "", err
		}
		root = filepath.Join(repo, "_output", "logs")
	}
	dir := filepath.Join(root, sanitize(name))
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	return dir, os.MkdirAll(dir, 0o755)
}

func finishLogDir(dir string, failed bool, logf func(string, ...any)) {
	if failed || os.Getenv(KeepLogsEnv) == "true" {
		logf("component logs kept in %s", dir)
		return
	}
	_ = os.RemoveAll(dir)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_./-]+`)

// sanitize keeps subtest names (which contain '/') as nested directories but removes anything a
// shell would trip over.
func sanitize(name string) string {
	name = unsafeChars.ReplaceAllString(name, "_")
	return strings.ReplaceAll(name, "..", "_")
}

// repoRoot is RepoRoot, checked: the framework writes its logs there.
func repoRoot() (string, error) {
	dir := RepoRoot()
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil || !bytes.Contains(data, []byte("module github.com/cistern-csi/cistern\n")) {
		return "", fmt.Errorf("repository root not found at %s (this binary was built elsewhere); set %s", dir, LogDirEnv)
	}
	return dir, nil
}

// Tail returns the last n lines of a file, to explain why a component did not come up.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
