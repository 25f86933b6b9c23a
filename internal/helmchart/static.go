package helmchart

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"strings"
)

// StaticPrefix is where the apiserver serves the static charts directory.
const StaticPrefix = "/static/charts/"

// Routes are the static charts' handlers by path, for the apiserver's mux
// (a path ending in "/" is a prefix), which authenticates and authorizes
// the requests first.
func Routes(dir string) map[string]http.Handler {
	return map[string]http.Handler{StaticPrefix: StaticHandler(dir)}
}

// StaticHandler serves the files directly in dir at StaticPrefix: GET and
// HEAD, no listings, nothing outside dir even through a symbolic link. The
// directory may appear after the server starts.
func StaticHandler(dir string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, StaticPrefix)
		if !ok || !fs.ValidPath(name) || strings.Contains(name, "/") || name == "." {
			http.NotFound(w, r)
			return
		}
		f, err := os.OpenInRoot(dir, name)
		if errors.Is(err, fs.ErrNotExist) {
			http.NotFound(w, r)
			return
		}
		if err != nil {
			log.WithError(err).WithField("file", name).Warn("serve a static chart")
			http.Error(w, "cannot read "+name, http.StatusInternalServerError)
			return
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, name, st.ModTime(), f)
	})
}
