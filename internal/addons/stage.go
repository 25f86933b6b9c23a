package addons

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"text/template"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Values are what the built-in manifests are rendered with, as
// text/template fields: {{ .ClusterDNS }}.
type Values struct {
	// ClusterDNS is the cluster DNS address, the kube-dns Service's.
	ClusterDNS string
	// ClusterDomain is the cluster's DNS domain: cluster.local.
	ClusterDomain string
	// ServingCA is the CA that signs the certificates kelp's servers
	// present (the apiserver's and the servers it runs beside it), PEM
	// and then base64: ready for an APIService's caBundle.
	ServingCA string
}

// Stage writes kelp's built-in manifests (NAME.yaml templates in builtins)
// into dir, rendered with v, and removes those named in disabled, whose
// objects are then deleted like those of any removed manifest. A file is
// rewritten only when its content differs. NAME.yaml.skip in dir leaves
// NAME.yaml as it is, disabled or not, as the Controller does: the user
// runs a version of their own under another name, or none.
func Stage(dir string, builtins fs.FS, v Values, disabled []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the manifests directory: %w", err)
	}
	names, err := fs.Glob(builtins, "*.yaml")
	if err != nil {
		return fmt.Errorf("list the built-in manifests: %w", err)
	}
	for _, file := range names {
		path := filepath.Join(dir, file)
		if _, err := os.Stat(path + SkipSuffix); err == nil {
			log.WithField("file", path).Debug("built-in manifest skipped: a .skip file is beside it")
			continue
		}
		if slices.Contains(disabled, addonName(file)) {
			if err := os.Remove(path); err == nil {
				log.WithField("file", path).Infof("built-in manifest removed (--disable %s); its objects are deleted", addonName(file))
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove the disabled built-in manifest: %w", err)
			}
			continue
		}
		data, err := render(builtins, file, v)
		if err != nil {
			return err
		}
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
			continue
		}
		if err := atomicfile.Write(path, data, 0o600); err != nil {
			return fmt.Errorf("write the built-in manifest: %w", err)
		}
	}
	return nil
}

// render executes one built-in manifest's template. A field the template
// asks for that Values does not have is an error, not an empty string.
func render(builtins fs.FS, file string, v Values) ([]byte, error) {
	text, err := fs.ReadFile(builtins, file)
	if err != nil {
		return nil, fmt.Errorf("read the built-in manifest %s: %w", file, err)
	}
	tmpl, err := template.New(file).Option("missingkey=error").Parse(string(text))
	if err != nil {
		return nil, fmt.Errorf("parse the built-in manifest %s: %w", file, err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, v); err != nil {
		return nil, fmt.Errorf("render the built-in manifest %s: %w", file, err)
	}
	return out.Bytes(), nil
}
