package notebook

import (
	"github.com/cistern-csi/cistern/test/testutil"
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
// without them, and the password never shows in git's output; a branch and a commit SHA that no
// branch points at are both cloned, and the commit used is the termination message.
func TestCloneWithCredentialsRealGit(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		testutil.Unavailable(t, "git not found: %v", err)
	}
	root := t.TempDir()
	run := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(gitBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
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
	first := run(work, "rev-parse", "HEAD")
	// A second commit, so that the first is reachable only by its SHA.
	if err := os.WriteFile(filepath.Join(work, "nb.ipynb"), []byte(`{"cells": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	run(work, "commit", "-q", "-am", "nb 2")
	head := run(work, "rev-parse", "HEAD")
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

	clone := func(ref string, files map[string]string) (string, error) {
		creds, dest := t.TempDir(), t.TempDir()
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(creds, name), []byte(content), 0o400); err != nil {
				t.Fatal(err)
			}
		}
		script := strings.ReplaceAll(strings.ReplaceAll(cloneScript, WorkspacePath, dest), CredentialsPath, creds)
		termination := filepath.Join(dest, "termination-log")
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dest, EnvGitURL + "=" + url, EnvGitRef + "=" + ref, "TERMINATION_LOG=" + termination}
		for _, e := range credentialsEnv {
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		}
		out, err := cmd.CombinedOutput()
		if err == nil {
			nb, statErr := os.ReadFile(filepath.Join(dest, "repo", "nb.ipynb"))
			msg, _ := os.ReadFile(termination)
			want := map[string]string{"main": head, first: first}[ref]
			if statErr != nil || (ref == first) != (string(nb) == "{}") || string(msg) != "commit="+want+"\n" {
				t.Errorf("ref %s: notebook %q %v, termination message %q, want commit %s", ref, nb, statErr, msg, want)
			}
		}
		return string(out), err
	}
	creds := map[string]string{"username": user, "password": password}
	for _, ref := range []string{"main", first} {
		if out, err := clone(ref, creds); err != nil || strings.Contains(out, password) {
			t.Errorf("clone of %s with credentials: %v\n%s", ref, err, out)
		}
	}
	if out, err := clone("main", map[string]string{"username": user, "password": "wrong"}); err == nil || strings.Contains(out, "wrong") {
		t.Errorf("clone with a wrong password: %v\n%s", err, out)
	}
	if out, err := clone("main", nil); err == nil || !strings.Contains(out, "Authentication failed") && !strings.Contains(out, "could not read Password") {
		t.Errorf("clone without credentials: %v\n%s", err, out)
	}
}
