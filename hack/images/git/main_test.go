package main

import (
	"errors"
	"testing"
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
