package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want cloneArgs
	}{
		{[]string{"clone", "--depth", "1", "--", "http://h/r.git", "/w/repo"}, cloneArgs{depth: 1, url: "http://h/r.git", dir: "/w/repo"}},
		{[]string{"clone", "--depth", "1", "--branch", "v1", "--", "http://h/r.git", "/w/repo"}, cloneArgs{depth: 1, branch: "v1", url: "http://h/r.git", dir: "/w/repo"}},
		{[]string{"clone", "--depth=2", "-b", "main", "http://h/r.git", "repo"}, cloneArgs{depth: 2, branch: "main", url: "http://h/r.git", dir: "repo"}},
		{[]string{"clone", "--", "-odd-url", "repo"}, cloneArgs{url: "-odd-url", dir: "repo"}},
		{[]string{"clone", "--no-checkout", "--", "http://h/r.git", "repo"}, cloneArgs{noCheckout: true, url: "http://h/r.git", dir: "repo"}},
	} {
		got, err := parse(tc.args)
		if err != nil || got != tc.want {
			t.Errorf("parse(%q) = %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
	}
	for _, args := range [][]string{
		nil,
		{"fetch"},
		{"clone", "http://h/r.git"},
		{"clone", "--depth", "0", "http://h/r.git", "repo"},
		{"clone", "--recursive", "http://h/r.git", "repo"},
		{"clone", "--branch"},
		{"clone", "a", "b", "c"},
	} {
		if _, err := parse(args); !errors.As(err, new(usageError)) {
			t.Errorf("parse(%q) = %v, want a usage error", args, err)
		}
	}
}

// The credential helper from git's configuration in the environment, as the notebook pod sets it.
func TestHelperAuth(t *testing.T) {
	helper := `!f() { test "$1" = get || exit 0; echo username=alice; echo password=tok; }; f`
	t.Setenv("GIT_CONFIG_COUNT", "2")
	t.Setenv("GIT_CONFIG_KEY_0", "user.name")
	t.Setenv("GIT_CONFIG_VALUE_0", "x")
	t.Setenv("GIT_CONFIG_KEY_1", "credential.helper")
	t.Setenv("GIT_CONFIG_VALUE_1", helper)
	auth, err := helperAuth("http://127.0.0.1:1/r.git")
	if err != nil {
		t.Fatal(err)
	}
	basic, ok := auth.(*githttp.BasicAuth)
	if !ok || basic.Username != "alice" || basic.Password != "tok" {
		t.Errorf("auth %#v", auth)
	}
	if auth, err := helperAuth("ssh://git@h/r.git"); auth != nil || err != nil {
		t.Errorf("ssh URL: %v %v", auth, err)
	}
	t.Setenv("GIT_CONFIG_COUNT", "0")
	if auth, err := helperAuth("http://127.0.0.1:1/r.git"); auth != nil || err != nil {
		t.Errorf("no helper: %v %v", auth, err)
	}
}

// The commands the clone script runs for a commit SHA: a full clone without checkout, a detached
// checkout of the commit, and rev-parse of HEAD.
func TestCloneCommit(t *testing.T) {
	src := t.TempDir()
	repo, err := git.PlainInit(src, false)
	if err != nil {
		t.Fatal(err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	commit := func(content string) plumbing.Hash {
		if err := os.WriteFile(filepath.Join(src, "nb.ipynb"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := wt.Add("nb.ipynb"); err != nil {
			t.Fatal(err)
		}
		h, err := wt.Commit(content, &git.CommitOptions{Author: &object.Signature{Name: "t", Email: "t@t", When: time.Now()}})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	first := commit("one")
	commit("two")

	dir := filepath.Join(t.TempDir(), "repo")
	if err := clone(cloneArgs{url: src, dir: dir, noCheckout: true}); err != nil {
		t.Fatal(err)
	}
	if err := inRepo(dir, []string{"checkout", "--detach", first.String()}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "nb.ipynb")); err != nil || string(b) != "one" {
		t.Errorf("checked out %q %v, want the first commit's", b, err)
	}
	if err := inRepo(dir, []string{"rev-parse", "HEAD"}); err != nil {
		t.Error(err)
	}
	cloned, _ := git.PlainOpen(dir)
	if head, err := cloned.Head(); err != nil || head.Hash() != first {
		t.Errorf("HEAD %v %v, want %s", head, err, first)
	}
	if err := inRepo(dir, []string{"log"}); !errors.As(err, new(usageError)) {
		t.Errorf("git -C dir log: %v, want a usage error", err)
	}
}
