package helmchart

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func raw(s string) json.RawMessage { return json.RawMessage(s) }

func TestValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		want map[string]any
	}{
		{"nothing", Spec{}, map[string]any{}},
		{"valuesContent", Spec{ValuesContent: "greeting: hello\nnested: {a: 1}\n"},
			map[string]any{"greeting": "hello", "nested": map[string]any{"a": float64(1)}}},
		{"set over valuesContent, siblings kept", Spec{
			ValuesContent: "nested: {a: 1, b: keep}\n",
			Set:           map[string]json.RawMessage{"nested.a": raw(`2`)},
		}, map[string]any{"nested": map[string]any{"a": int64(2), "b": "keep"}}},
		{"typed and string values", Spec{Set: map[string]json.RawMessage{
			"count":   raw(`3`),
			"on":      raw(`true`),
			"offText": raw(`"false"`), // k3s's CRD takes no booleans
			"port":    raw(`"8080"`),  // a string stays a string
			"gone":    raw(`null`),
		}}, map[string]any{"count": int64(3), "on": true, "offText": false, "port": "8080", "gone": nil}},
		{"--set syntax in a string is text", Spec{Set: map[string]json.RawMessage{
			"list": raw(`"a,b"`), "braces": raw(`"{x,y}"`), "slash": raw(`"c:\\dir"`),
		}}, map[string]any{"list": "a,b", "braces": "{x,y}", "slash": `c:\dir`}},
		{"paths with indexes", Spec{Set: map[string]json.RawMessage{"hosts[0].name": raw(`"a"`)}},
			map[string]any{"hosts": []any{map[string]any{"name": "a"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.spec.Values()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestValuesErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"valuesContent not YAML", Spec{ValuesContent: "greeting: [unclosed"}, "spec.valuesContent"},
		{"valuesContent a list", Spec{ValuesContent: "- a\n- b\n"}, "spec.valuesContent"},
		{"set to an object", Spec{Set: map[string]json.RawMessage{"a": raw(`{"b":1}`)}}, "spec.set.a: want a string"},
		{"bad path", Spec{Set: map[string]json.RawMessage{"a[x]": raw(`1`)}}, "spec.set.a[x]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.spec.Values()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestHash(t *testing.T) {
	base := Spec{Chart: "demo", ValuesContent: "a: 1", Set: map[string]json.RawMessage{"x": raw(`1`), "y": raw(`"z"`)}}
	same := Spec{Chart: "demo", ValuesContent: "a: 1", Set: map[string]json.RawMessage{"y": raw(`"z"`), "x": raw(`1`)}}
	if base.Hash() != same.Hash() {
		t.Error("the order of set's keys changed the hash")
	}
	for name, changed := range map[string]Spec{
		"values":    {Chart: "demo", ValuesContent: "a: 2", Set: base.Set},
		"set":       {Chart: "demo", ValuesContent: "a: 1", Set: map[string]json.RawMessage{"x": raw(`2`), "y": raw(`"z"`)}},
		"set type":  {Chart: "demo", ValuesContent: "a: 1", Set: map[string]json.RawMessage{"x": raw(`"1"`), "y": raw(`"z"`)}},
		"namespace": {Chart: "demo", ValuesContent: "a: 1", Set: base.Set, TargetNamespace: "other"},
		"timeout":   {Chart: "demo", ValuesContent: "a: 1", Set: base.Set, Timeout: "1m"},
	} {
		if changed.Hash() == base.Hash() {
			t.Errorf("a new %s left the hash as it was", name)
		}
	}
}

func TestDecode(t *testing.T) {
	obj := helmChartObject(t, `{
		"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
		"metadata": {"name": "demo", "namespace": "kube-system", "generation": 2},
		"spec": {"chart": "demo", "repo": "https://charts.example", "set": {"a": 1, "b": "two"}, "timeout": "90s", "jobImage": "ignored"},
		"status": {"specHash": "abc", "conditions": [{"type": "Deployed", "status": "True", "reason": "Installed", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
	}`)
	hc, err := decode(obj)
	if err != nil {
		t.Fatal(err)
	}
	if hc.Name != "demo" || hc.Generation != 2 || hc.Spec.Repo != "https://charts.example" || hc.Spec.Timeout != "90s" {
		t.Errorf("decoded %+v", hc)
	}
	if string(hc.Spec.Set["a"]) != "1" || string(hc.Spec.Set["b"]) != `"two"` {
		t.Errorf("set decoded as %s", hc.Spec.Set)
	}
	if hc.releaseNamespace() != "kube-system" {
		t.Errorf("release namespace %q, want the HelmChart's", hc.releaseNamespace())
	}
	if hc.deployed() {
		t.Error("a status of another spec's hash counts as deployed")
	}
	hc.Status.SpecHash = hc.Spec.Hash()
	if !hc.deployed() {
		t.Error("a status of this spec's hash, Deployed True, does not count as deployed")
	}
}

func TestTimeout(t *testing.T) {
	for in, want := range map[string]time.Duration{"": defaultTimeout, "90s": 90 * time.Second, "10m": 10 * time.Minute} {
		if got, err := (Spec{Timeout: in}).timeout(); err != nil || got != want {
			t.Errorf("timeout %q: %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"300", "soon", "-1s", "0s"} {
		_, err := Spec{Timeout: in}.timeout()
		if reasonOf(err) != ReasonSpecInvalid {
			t.Errorf("timeout %q: got %v, want SpecInvalid", in, err)
		}
	}
}
