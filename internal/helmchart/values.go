package helmchart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	"k8s.io/apimachinery/pkg/util/sets"
)

// typedStrings are the strings spec.set passes typed, as k3s does: the
// CRD of k3s takes only strings and integers, so booleans are written as
// strings there.
var typedStrings = sets.New("true", "false")

// Values are the values a spec installs its chart with: ValuesContent,
// then each key of Set over it, in key order, as `helm --values … --set …`
// would. Numbers, booleans, null and the strings "true" and "false" are set
// typed (--set); other strings as they are (--set-string).
func (s Spec) Values() (map[string]any, error) {
	vals, err := chartutil.ReadValues([]byte(s.ValuesContent))
	if err != nil {
		return nil, fmt.Errorf("spec.valuesContent is not a YAML map: %w", err)
	}
	for _, key := range slices.Sorted(maps.Keys(s.Set)) {
		if err := setValue(vals, key, s.Set[key]); err != nil {
			return nil, err
		}
	}
	return vals, nil
}

// setValue sets key (a --set path: a.b[0].c) to raw in vals.
func setValue(vals map[string]any, key string, raw json.RawMessage) error {
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber() // keep big integers as they were written
	if err := d.Decode(&v); err != nil {
		return fmt.Errorf("spec.set.%s: %w", key, err)
	}
	var err error
	switch v := v.(type) {
	case string:
		if typedStrings.Has(v) {
			err = strvals.ParseInto(key+"="+v, vals)
		} else {
			err = strvals.ParseIntoString(key+"="+escape(v), vals)
		}
	case json.Number, bool, nil:
		err = strvals.ParseInto(key+"="+jsonText(v), vals)
	default:
		return fmt.Errorf("spec.set.%s: want a string, a number or a boolean, got %s (put structured values in spec.valuesContent)", key, raw)
	}
	if err != nil {
		return fmt.Errorf("spec.set.%s: %w", key, err)
	}
	return nil
}

// escape keeps the characters that --set-string treats as syntax (a comma
// separates values, a brace opens a list, a backslash escapes) as literal
// text.
func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `,`, `\,`, `{`, `\{`).Replace(s)
}

// jsonText writes a scalar the way --set reads it.
func jsonText(v any) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(v)
}
