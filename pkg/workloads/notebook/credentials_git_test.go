package notebook

import (
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The clone script with the credentials environment, run by the host's git against a smart-HTTP
// server on loopback that wants basic auth: the clone succeeds with the Secret's files and fails
// without them, and the password never shows in git's output.
func TestCloneWithCredentialsRealGit(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("git not found: %v", err)
		}
		t.Skipf("git not found: %v", err)
	}
	root := t.TempDir()
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(gitBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	work := filepath.Join(root, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	run(work, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(work, "nb.ipynb"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(work, "add", ".")
	run(work, "commit", "-q", "-m", "nb")
	run(root, "clone", "-q", "--bare", work, filepath.Join(root, "repo.git"))

	const user, password = "alice", "tok-3f9a1c"
	backend := &cgi.Handler{Path: gitBin, Args: []string{"http-backend"},
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + l.Addr().String() + "/repo.git"

	clone := func(files map[string]string) (string, error) {
		creds, dest := t.TempDir(), t.TempDir()
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(creds, name), []byte(content), 0o400); err != nil {
				t.Fatal(err)
			}
		}
		script := strings.ReplaceAll(cloneScript, WorkspacePath, dest)
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dest, EnvGitURL + "=" + url, EnvGitRef + "=main"}
		for _, e := range credentialsEnv {
			cmd.Env = append(cmd.Env, e.Name+"="+strings.ReplaceAll(e.Value, CredentialsPath, creds))
		}
		out, err := cmd.CombinedOutput()
		if err == nil {
			if _, statErr := os.Stat(filepath.Join(dest, "repo", "nb.ipynb")); statErr != nil {
				t.Errorf("clone has no notebook: %v", statErr)
			}
		}
		return string(out), err
	}
	for _, files := range []map[string]string{{"username": user, "password": password}} {
		if out, err := clone(files); err != nil || strings.Contains(out, password) {
			t.Errorf("clone with credentials: %v\n%s", err, out)
		}
	}
	if out, err := clone(map[string]string{"username": user, "password": "wrong"}); err == nil || strings.Contains(out, "wrong") {
		t.Errorf("clone with a wrong password: %v\n%s", err, out)
	}
	if out, err := clone(nil); err == nil || !strings.Contains(out, "Authentication failed") && !strings.Contains(out, "could not read Password") {
		t.Errorf("clone without credentials: %v\n%s", err, out)
	}
}
