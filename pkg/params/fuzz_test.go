package params

import (
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// FuzzParse: any parameter map a pod author writes (inline volume attributes are theirs) either
// parses or is refused with a classified error (Invalid or Denied), never a panic; what parses
// has an ID that parses the same way again. The input is "key=value" lines.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"source=s3://models/llama/7b/\nendpoint=http://minio:9000\nregion=eu-west-1\npathStyle=true\ninclude=*.safetensors, *.json\nexclude=old/**\npool=fast",
		"source=nfs://filer/export/data\nsize=1Gi",
		"source=file:///data/sets/a\ncapacity=10Gi",
		"poolSelector=media in (ssd,nvme)\nsize=100Mi",
		"source=s3://b/p/\ninclude=" + strings.Repeat("**/", 40) + "x",
		"source=s3://user:pass@b/p/",
		"endpoint=http://169.254.169.254/",
	} {
		f.Add(s, uint8(Inline))
		f.Add(s, uint8(StorageClass))
	}
	f.Fuzz(func(t *testing.T, in string, u uint8) {
		use := []Use{StorageClass, Inline, StaticPV}[int(u)%3]
		m := map[string]string{}
		for line := range strings.SplitSeq(in, "\n") {
			k, v, _ := strings.Cut(line, "=")
			m[k] = v
		}
		v, err := Parse(m, use)
		if err != nil {
			if k := source.KindOf(err); k != source.Invalid && k != source.Denied {
				t.Fatalf("Parse(%q, %s): error of kind %v, want Invalid or Denied: %v", m, use, k, err)
			}
			return
		}
		if v.Size < 0 || v.Capacity < 0 {
			t.Fatalf("Parse(%q): negative size %d or capacity %d", m, v.Size, v.Capacity)
		}
		if v.Dataset != nil {
			if len(v.Dataset.Include) > source.MaxPatterns || len(v.Dataset.Exclude) > source.MaxPatterns {
				t.Fatalf("Parse(%q): more patterns than the bound", m)
			}
			if id := v.Dataset.ID(); id == "" || id != v.Dataset.ID() {
				t.Fatalf("Parse(%q): unstable dataset ID %q", m, id)
			}
		}
	})
}
