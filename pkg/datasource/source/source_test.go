package source

import "testing"

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"a/b/c.txt", true},
		{"..a/b..", true},
		{"a/.hidden", true},
		{"", false},
		{"/etc/passwd", false},
		{"..", false},
		{"a/../../etc/passwd", false},
		{"a/..", false},
		{"a/./b", false},
		{"a//b", false},
		{"a/", false},
		{"a\x00b", false},
	} {
		t.Run(tc.key, func(t *testing.T) {
			err := ValidateKey(tc.key)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateKey(%q) = %v, want ok=%v", tc.key, err, tc.ok)
			}
			if err != nil && KindOf(err) != Unsafe {
				t.Fatalf("kind %v, want unsafe", KindOf(err))
			}
		})
	}
}

func TestValidateSymlink(t *testing.T) {
	for _, tc := range []struct {
		key, target string
		ok          bool
	}{
		{"a", "b", true},
		{"d/a", "../b", true},
		{"d/e/a", "../../b/c", true},
		{"a", "../b", false},
		{"d/a", "../../b", false},
		{"a", "/etc/passwd", false},
		{"d/a", "b/../../x", false},
		{"d/a", "./b", false},
		{"d/a", "", false},
	} {
		t.Run(tc.key+"->"+tc.target, func(t *testing.T) {
			if err := ValidateSymlink(tc.key, tc.target); (err == nil) != tc.ok {
				t.Fatalf("ValidateSymlink(%q, %q) = %v, want ok=%v", tc.key, tc.target, err, tc.ok)
			}
		})
	}
}

func TestFilter(t *testing.T) {
	for _, tc := range []struct {
		name             string
		include, exclude string
		key              string
		want             bool
	}{
		{"no patterns", "", "", "a/b.bin", true},
		{"base name glob", "*.json", "", "x/y/config.json", true},
		{"base name glob miss", "*.json", "", "x/y/model.bin", false},
		{"double star", "**/*.safetensors", "", "a/b/m.safetensors", true},
		{"double star root", "**/*.safetensors", "", "m.safetensors", true},
		{"directory include", "train", "", "train/0001.bin", true},
		{"directory include miss", "train", "", "test/0001.bin", false},
		{"exclude wins", "*.bin", "test/**", "test/0001.bin", false},
		{"exclude other", "*.bin", "test/**", "train/0001.bin", true},
		{"list", "a/*, b/*", "", "b/x", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inc, err := ParsePatterns(tc.include)
			if err != nil {
				t.Fatal(err)
			}
			exc, err := ParsePatterns(tc.exclude)
			if err != nil {
				t.Fatal(err)
			}
			if got := (Filter{Include: inc, Exclude: exc}).Match(tc.key); got != tc.want {
				t.Fatalf("Match(%q) = %v, want %v", tc.key, got, tc.want)
			}
		})
	}
	if _, err := ParsePatterns("a/[b"); err == nil {
		t.Fatal("bad pattern accepted")
	}
}
