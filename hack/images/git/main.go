// Command git stands in for git in the node-level tests' git image, where the notebook jobs'
// git-clone init container runs `/bin/sh -c 'git clone ...'` (busybox is the shell). It knows the
// commands that script uses:
//
//	git clone [--depth N] [--branch REF | -b REF] [--no-checkout] [--] URL DIR
//	git -C DIR checkout --detach COMMIT
//	git -C DIR rev-parse HEAD
//
// and clones with go-git over the transports go-git speaks (the tests serve smart HTTP). REF is a
// branch or a tag, as for git. Anything else is refused with git's exit code for usage errors,
// so a script that needs more of git fails loudly instead of passing by accident.
//
// Credentials come as git takes them from configuration in the environment
// (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_<n>, GIT_CONFIG_VALUE_<n>): a credential.helper of the "!"
// (shell) form is run with "get" and its username= and password= lines are sent as basic auth.
// Real git asks the helper only after the server answers 401; the stand-in asks it up front.
package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Exit codes of git: 128 for fatal errors, 129 for usage errors.
const (
	exitFatal = 128
	exitUsage = 129
)

// cloneArgs are the parsed arguments of `git clone`.
type cloneArgs struct {
	depth      int
	branch     string
	noCheckout bool
	url        string
	dir        string
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func main() {
	if len(os.Args) > 2 && os.Args[1] == "-C" {
		if err := inRepo(os.Args[2], os.Args[3:]); err != nil {
			var u usageError
			if errors.As(err, &u) {
				fmt.Fprintf(os.Stderr, "error: %v\n", err)
				os.Exit(exitUsage)
			}
			fmt.Fprintf(os.Stderr, "fatal: %v\n", err)
			os.Exit(exitFatal)
		}
		return
	}
	args, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\nusage: git clone [--depth N] [--branch REF] [--] URL DIR (git stand-in of the Cistern node tests)\n", err)
		os.Exit(exitUsage)
	}
	fmt.Fprintf(os.Stderr, "Cloning into '%s'...\n", args.dir)
	if err := clone(args); err != nil {
		fmt.Fprintf(os.Stderr, "fatal: %v\n", err)
		os.Exit(exitFatal)
	}
}

func parse(argv []string) (cloneArgs, error) {
	var a cloneArgs
	if len(argv) == 0 || argv[0] != "clone" {
		return a, usageError{"only `git clone` is implemented"}
	}
	var pos []string
	rest := argv[1:]
	for len(rest) > 0 {
		arg := rest[0]
		rest = rest[1:]
		if arg == "--" {
			pos = append(pos, rest...)
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			pos = append(pos, arg)
			continue
		}
		if arg == "--no-checkout" {
			a.noCheckout = true
			continue
		}
		name, value, hasValue := strings.Cut(arg, "=")
		if name != "--depth" && name != "--branch" && name != "-b" {
			return a, usageError{"unknown option " + name}
		}
		if !hasValue {
			if len(rest) == 0 {
				return a, usageError{"option " + name + " needs a value"}
			}
			value, rest = rest[0], rest[1:]
		}
		if name == "--depth" {
			n, err := strconv.Atoi(value)
			if err != nil || n < 1 {
				return a, usageError{fmt.Sprintf("depth %s is not a positive number", value)}
			}
			a.depth = n
		} else {
			a.branch = value
		}
	}
	if len(pos) != 2 {
		return a, usageError{"want a repository URL and a directory"}
	}
	a.url, a.dir = pos[0], pos[1]
	return a, nil
}

// clone clones like git: a shallow clone fetches only the branch it checks out.
func clone(a cloneArgs) error {
	auth, err := helperAuth(a.url)
	if err != nil {
		return err
	}
	ref, err := resolveRef(a.url, a.branch, auth)
	if err != nil {
		return err
	}
	_, err = git.PlainClone(a.dir, false, &git.CloneOptions{
		URL:           a.url,
		Auth:          auth,
		ReferenceName: ref,
		SingleBranch:  a.depth > 0 || a.branch != "",
		Depth:         a.depth,
		Tags:          git.NoTags,
		NoCheckout:    a.noCheckout,
		Progress:      os.Stderr,
	})
	if err != nil {
		return fmt.Errorf("cloning %s: %w", a.url, err)
	}
	return nil
}

// inRepo runs the commands the clone script runs in a cloned repository: checkout --detach COMMIT
// and rev-parse HEAD.
func inRepo(dir string, argv []string) error {
	repo, err := git.PlainOpen(dir)
	if err != nil {
		return fmt.Errorf("not a git repository: %s: %w", dir, err)
	}
	switch {
	case len(argv) == 3 && argv[0] == "checkout" && argv[1] == "--detach":
		hash, err := repo.ResolveRevision(plumbing.Revision(argv[2]))
		if err != nil {
			return fmt.Errorf("reference is not a tree: %s", argv[2])
		}
		wt, err := repo.Worktree()
		if err != nil {
			return err
		}
		return wt.Checkout(&git.CheckoutOptions{Hash: *hash, Force: true})
	case len(argv) == 2 && argv[0] == "rev-parse" && argv[1] == "HEAD":
		head, err := repo.Head()
		if err != nil {
			return err
		}
		fmt.Println(head.Hash().String())
		return nil
	}
	return usageError{fmt.Sprintf("only `checkout --detach COMMIT` and `rev-parse HEAD` are implemented with -C, not %q", argv)}
}

// resolveRef finds the branch or tag a --branch value names on the remote, as git does; empty
// means the remote's HEAD.
func resolveRef(url, name string, auth transport.AuthMethod) (plumbing.ReferenceName, error) {
	if name == "" {
		return "", nil
	}
	remote := git.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: "origin", URLs: []string{url}})
	refs, err := remote.List(&git.ListOptions{Auth: auth})
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", url, err)
	}
	for _, want := range []plumbing.ReferenceName{plumbing.NewBranchReferenceName(name), plumbing.NewTagReferenceName(name)} {
		for _, r := range refs {
			if r.Name() == want {
				return want, nil
			}
		}
	}
	return "", errors.New("Remote branch " + name + " not found in upstream origin")
}

// helperAuth runs the credential helper configured in the environment, if any, for an HTTP(S)
// URL, as git would: `/bin/sh -c '<helper> "$@"' <helper> get` with the request on stdin.
func helperAuth(rawURL string) (transport.AuthMethod, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, nil
	}
	helper := configValue(os.Environ(), "credential.helper")
	if helper == "" {
		return nil, nil
	}
	if !strings.HasPrefix(helper, "!") {
		return nil, fmt.Errorf("credential helper %q: the stand-in runs only shell (\"!\") helpers", helper)
	}
	script := strings.TrimPrefix(helper, "!")
	cmd := exec.Command("/bin/sh", "-c", script+` "$@"`, script, "get")
	cmd.Stdin = strings.NewReader("protocol=" + u.Scheme + "\nhost=" + u.Host + "\n\n")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("credential helper: %w", err)
	}
	var basic githttp.BasicAuth
	for line := range strings.Lines(string(out)) {
		k, v, _ := strings.Cut(strings.TrimRight(line, "\n"), "=")
		switch k {
		case "username":
			basic.Username = v
		case "password":
			basic.Password = v
		}
	}
	if basic.Password == "" {
		return nil, nil
	}
	return &basic, nil
}

// configValue is the last value of key in git's configuration from the environment.
func configValue(env []string, key string) string {
	vars := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		vars[k] = v
	}
	n, _ := strconv.Atoi(vars["GIT_CONFIG_COUNT"])
	var value string
	for i := range n {
		if strings.EqualFold(vars["GIT_CONFIG_KEY_"+strconv.Itoa(i)], key) {
			value = vars["GIT_CONFIG_VALUE_"+strconv.Itoa(i)]
		}
	}
	return value
}
