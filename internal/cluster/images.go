package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/images"
	"github.com/kelp-dev/kelp/internal/layout"
)

// imageFiles lists the image tarballs at path: the file, or the tarballs
// in the directory. Each must be an image tarball.
func imageFiles(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("image %w", err)
	}
	files := []string{path}
	if info.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		files = nil
		for _, e := range entries {
			if e.Type().IsRegular() && images.IsTarball(e.Name()) {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s has no image tarball (*.tar, *.tar.gz, *.tgz, *.tar.zst)", path)
		}
	}
	for _, f := range files {
		if err := images.CheckTarball(f); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// copyImages copies the image tarballs at path (a file or a directory)
// into a node's airgap images directory, each whole or not at all: the
// node imports a file once it appears there.
func copyImages(path, imagesDir string) error {
	files, err := imageFiles(path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(imagesDir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(imagesDir, filepath.Base(f))); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	// A hidden name the node does not import: it ends in no tarball suffix.
	tmp, err := atomicfile.Temp(filepath.Dir(dst), "."+filepath.Base(dst)+".part-", 0o600, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	})
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return atomicfile.SyncDir(filepath.Dir(dst))
}

// ImportImages puts the image tarballs at paths into every node of the
// cluster and, on a running cluster, waits until every node has imported
// them, so a pod that uses them can start at once; it prints what each
// node imported on w.
func ImportImages(ctx context.Context, root, name string, paths []string, w io.Writer) error {
	dir := filepath.Join(root, name)
	s, err := load(dir)
	if err != nil {
		return notFound(name, err)
	}
	var files []string
	for _, p := range paths {
		f, err := imageFiles(p)
		if err != nil {
			return err
		}
		files = append(files, f...)
	}
	for _, n := range s.Nodes {
		for _, f := range files {
			if err := copyImages(f, nodeDir(dir, n).images()); err != nil {
				return err
			}
		}
	}
	if !s.Running {
		fmt.Fprintf(w, "cluster %s is stopped: its nodes import the images when it starts\n", name)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, n := range s.Nodes {
		state := layout.Agent(nodeDir(dir, n).data()).AirgapImagesState
		for _, f := range files {
			dst := filepath.Join(nodeDir(dir, n).images(), filepath.Base(f))
			info, err := os.Stat(dst)
			if err != nil {
				return err
			}
			for {
				names, ok := images.ImportedFrom(state, filepath.Base(f), info.Size(), info.ModTime())
				if ok {
					fmt.Fprintf(w, "%s: %v\n", n.Name, names)
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("node %s has not imported %s: its log %s says why", n.Name, filepath.Base(f), nodeDir(dir, n).log())
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	}
	return nil
}

func nodeDir(dir string, n *Node) nodePaths { return paths{dir}.node(n.Name) }
