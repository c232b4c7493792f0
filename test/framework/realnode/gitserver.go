package realnode

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// GitServer serves the bare repositories below root over git's smart HTTP protocol: the host's
// `git http-backend` behind net/http/cgi. It listens on every address because pods reach it at
// the pod network's gateway, which exists only while a pod's veth does, and it answers only
// loopback and the pod network.
type GitServer struct {
	git     string
	root    string
	port    int
	gateway string
	// podRequests counts the requests that came from the pod network.
	PodRequests atomic.Int64
	// private maps a repository path prefix ("/name.git/") to the user and password it wants.
	private sync.Map
	// refused counts the requests refused for want of credentials.
	Refused atomic.Int64
}

// Protect makes the repository name private: every request must carry basic auth with user and
// password, as a private repository on a git host does.
func (g *GitServer) Protect(name, user, password string) {
	g.private.Store("/"+name+".git/", [2]string{user, password})
}

// authorized says whether r may read the repository it asks for.
func (g *GitServer) authorized(r *http.Request) bool {
	ok := true
	g.private.Range(func(prefix, creds any) bool {
		if strings.HasPrefix(r.URL.Path, prefix.(string)) {
			want := creds.([2]string)
			u, p, has := r.BasicAuth()
			ok = has && u == want[0] && p == want[1]
			return false
		}
		return true
	})
	return ok
}

// StartGitServer serves the pod network subnet, whose pods reach the host at gateway.
func StartGitServer(t *testing.T, subnet, gateway string) *GitServer {
	t.Helper()
	gitBin, err := exec.LookPath("git")
	if err != nil {
		Unavailable(t, "the notebook scenarios serve their repository with the host's git: %v; run `make node-host-packages`", err)
	}
	g := &GitServer{git: gitBin, root: t.TempDir(), gateway: gateway}
	_, pods, err := net.ParseCIDR(subnet)
	if err != nil {
		t.Fatal(err)
	}
	backend := &cgi.Handler{
		Path:       gitBin,
		Args:       []string{"http-backend"},
		Env:        append(gitEnv(g.root), "GIT_PROJECT_ROOT="+g.root, "GIT_HTTP_EXPORT_ALL=1"),
		InheritEnv: []string{"PATH"},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host)
		switch {
		case ip == nil:
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		case pods.Contains(ip):
			g.PodRequests.Add(1)
		case !ip.IsLoopback():
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		if !g.authorized(r) {
			g.Refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="cistern-e2e"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	g.port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return g
}

// gitEnv keeps the host's and the user's git configuration out of the test's git commands.
func gitEnv(home string) []string {
	return []string{
		"HOME=" + home, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=cistern", "GIT_AUTHOR_EMAIL=e2e@cistern.invalid",
		"GIT_COMMITTER_NAME=cistern", "GIT_COMMITTER_EMAIL=e2e@cistern.invalid",
	}
}

// CreateRepo commits files (path -> content) on branch main, tags the commit with each of tags,
// and serves the result as <name>.git. It returns the URL pods clone.
func (g *GitServer) CreateRepo(t *testing.T, name string, files map[string]string, tags ...string) string {
	t.Helper()
	work := t.TempDir()
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(g.git, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), gitEnv(work)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(work, "init", "-q", "-b", "main")
	for path, content := range files {
		full := filepath.Join(work, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(work, "add", "-A")
	run(work, "commit", "-q", "-m", "notebooks")
	for _, tag := range tags {
		run(work, "tag", tag)
	}
	bare := filepath.Join(g.root, name+".git")
	run(work, "clone", "-q", "--bare", work, bare)
	if _, err := os.Stat(filepath.Join(bare, "HEAD")); errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no bare repository at %s", bare)
	}
	return fmt.Sprintf("http://%s:%d/%s.git", g.gateway, g.port, name)
}

// Head returns the commit SHA of the main branch of the repository CreateRepo served as name.
func (g *GitServer) Head(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command(g.git, "--git-dir", filepath.Join(g.root, name+".git"), "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD of %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}
