// Command git stands in for git in the node-level tests' git image, where the notebook jobs'
// git-clone init container runs `/bin/sh -c 'git clone ...'` (busybox is the shell). It knows one
// command, the one that script uses:
//
//	git clone [--depth N] [--branch REF | -b REF] [--] URL DIR
//
// and clones with go-git over the transports go-git speaks (the tests serve smart HTTP). REF is a
// branch or a tag, as for git. Anything else is refused with git's exit code for usage errors,
// so a script that needs more of git fails loudly instead of passing by accident.
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Exit codes of git: 128 for fatal errors, 129 for usage errors.
const (
	exitFatal = 128
	exitUsage = 129
)

// cloneArgs are the parsed arguments of `git clone`.
type cloneArgs struct {
	depth  int
	branch string
	url    string
	dir    string
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func main() {
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
	ref, err := resolveRef(a.url, a.branch)
	if err != nil {
		return err
	}
	_, err = git.PlainClone(a.dir, false, &git.CloneOptions{
		URL:           a.url,
		ReferenceName: ref,
		SingleBranch:  a.depth > 0 || a.branch != "",
		Depth:         a.depth,
		Tags:          git.NoTags,
		Progress:      os.Stderr,
	})
	if err != nil {
		return fmt.Errorf("cloning %s: %w", a.url, err)
	}
	return nil
}

// resolveRef finds the branch or tag a --branch value names on the remote, as git does; empty
// means the remote's HEAD.
func resolveRef(url, name string) (plumbing.ReferenceName, error) {
	if name == "" {
		return "", nil
	}
	remote := git.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: "origin", URLs: []string{url}})
	refs, err := remote.List(&git.ListOptions{})
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
