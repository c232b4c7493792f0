package chart

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"
)

// secretDataLimit is the API server's limit on a Secret's data, where Helm keeps each release.
const secretDataLimit = 1 << 20

// TestChartReleaseFitsInASecret: Helm stores each release (the chart with all its files, and the
// rendered manifest) gzipped in one Secret. The LeaderWorkerSet CRD with the field docs of its
// embedded pod templates once took the release over the limit, and helm install failed on the
// real node; this measures the Secret Helm's own storage driver writes, with every switch on.
func TestChartReleaseFitsInASecret(t *testing.T) {
	for _, values := range []string{"", "snapshots: {enabled: true}\nleaderWorkerSet: {upstreamAPI: true}"} {
		chrt, err := loader.Load(filepath.Join(repoRoot(), "charts", "cistern"))
		if err != nil {
			t.Fatal(err)
		}
		files := renderFiles(t, namespace, values)
		var manifest strings.Builder
		for _, name := range slices.Sorted(maps.Keys(files)) {
			manifest.WriteString(files[name])
		}
		rls := &release.Release{Name: "cistern", Namespace: namespace, Version: 1, Chart: chrt,
			Manifest: manifest.String(), Info: &release.Info{Status: release.StatusDeployed}}
		secrets := fake.NewClientset().CoreV1().Secrets(namespace)
		if err := driver.NewSecrets(secrets).Create("sh.helm.release.v1.cistern.v1", rls); err != nil {
			t.Fatal(err)
		}
		stored, err := secrets.Get(context.Background(), "sh.helm.release.v1.cistern.v1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		size := 0
		for _, v := range stored.Data {
			size += len(v)
		}
		t.Logf("values %q: the release Secret holds %d bytes (limit %d)", values, size, secretDataLimit)
		if size > secretDataLimit {
			t.Errorf("values %q: the release Secret would hold %d bytes, over the API server's %d", values, size, secretDataLimit)
		}
	}
}

// chartMetadata is what the release tests read of Chart.yaml.
type chartMetadata struct {
	Version     string `json:"version"`
	AppVersion  string `json:"appVersion"`
	KubeVersion string `json:"kubeVersion"`
}

func readChart(t *testing.T) chartMetadata {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m chartMetadata
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestReleaseVersion: the chart's version is a release's (0.2.0), its appVersion the images'
// tag of that release (v0.2.0), and what helm renders carries both: the chart label and, with
// image.tag empty, every Cistern image at the appVersion.
func TestReleaseVersion(t *testing.T) {
	m := readChart(t)
	if m.Version != "0.2.0" || m.AppVersion != "v"+m.Version {
		t.Fatalf("Chart.yaml: version %q, appVersion %q; want 0.2.0 and v0.2.0", m.Version, m.AppVersion)
	}
	objs := helmObjects(t, "image: {tag: \"\"}")
	for k, o := range objs {
		labels, _ := nested(o, "metadata", "labels").(map[string]any)
		if labels["helm.sh/chart"] != "cistern-"+m.Version {
			t.Errorf("%s: label helm.sh/chart %v, want cistern-%s", k, labels["helm.sh/chart"], m.Version)
		}
	}
	n := 0
	for k, spec := range pods(objs) {
		for _, c := range containers(spec) {
			if img := c["image"].(string); strings.HasPrefix(img, "registry.example.com/cistern/") {
				n++
				if !strings.HasSuffix(img, ":"+m.AppVersion) {
					t.Errorf("%s: container %s has image %s, want the tag %s", k, c["name"], img, m.AppVersion)
				}
			}
		}
	}
	if n == 0 {
		t.Error("no container runs a Cistern image")
	}
}

// TestReleaseMakeVersion: `make version`, what make stamps the binaries and images with, is git
// describe's tag where one is reachable, the chart's version with the commit where none is, and
// the chart's version where there is no git at all.
func TestReleaseMakeVersion(t *testing.T) {
	m := readChart(t)
	makeVersion := func(env ...string) string {
		cmd := exec.Command("make", "-s", "--no-print-directory", "-C", repoRoot(), "version")
		// Not the caller's make: its VERSION and flags would reach this one.
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool {
			return strings.HasPrefix(e, "VERSION=") || strings.HasPrefix(e, "MAKEFLAGS=") || strings.HasPrefix(e, "MAKELEVEL=") || strings.HasPrefix(e, "MFLAGS=")
		}), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make version: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := makeVersion("GIT_DIR=" + t.TempDir()); got != "v"+m.Version {
		t.Errorf("without git, make version = %q, want v%s", got, m.Version)
	}
	got := makeVersion()
	if tag, err := exec.Command("git", "-C", repoRoot(), "describe", "--tags", "--dirty").Output(); err == nil {
		if want := strings.TrimSpace(string(tag)); got != want {
			t.Errorf("make version = %q, want git describe's %q", got, want)
		}
	} else if !regexp.MustCompile(`^v` + regexp.QuoteMeta(m.Version) + `-dev-[0-9a-f]{7,}(-dirty)?$`).MatchString(got) {
		t.Errorf("without a tag, make version = %q, want v%s-dev-<commit>", got, m.Version)
	}
}

// TestReleaseFiles: the license is the Apache License 2.0 verbatim (the copy client-go ships)
// with the copyright of the Cistern Authors in its appendix, and the changelog, in Keep a
// Changelog's form, has an Unreleased section and an entry for the chart's version.
func TestReleaseFiles(t *testing.T) {
	m := readChart(t)
	license, err := os.ReadFile(filepath.Join(repoRoot(), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/client-go").Output()
	if err != nil {
		t.Fatal(err)
	}
	apache, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(string(apache), "Copyright [yyyy] [name of copyright owner]", "Copyright 2026 The Cistern Authors", 1)
	if string(license) != want {
		t.Error("LICENSE is not the Apache License 2.0 with \"Copyright 2026 The Cistern Authors\"")
	}
	changelog, err := os.ReadFile(filepath.Join(repoRoot(), "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^# Changelog$`,
		`keepachangelog\.com`,
		`(?m)^## \[Unreleased\]$`,
		`(?m)^## \[` + regexp.QuoteMeta(m.Version) + `\] - \d{4}-\d{2}-\d{2}$`,
		`(?m)^\[Unreleased\]: \S+v` + regexp.QuoteMeta(m.Version) + `\.\.\.HEAD$`,
		`(?m)^\[` + regexp.QuoteMeta(m.Version) + `\]: \S+$`,
	} {
		if !regexp.MustCompile(re).Match(changelog) {
			t.Errorf("CHANGELOG.md has no match for %s", re)
		}
	}
}
