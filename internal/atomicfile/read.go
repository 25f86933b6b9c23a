package atomicfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ReadRegular reads the regular file at path, of at most limit bytes. It
// is for files whose path someone else chose (a token file, another
// process's config file): a FIFO would hang a plain open, a device would
// be opened, and an endless file read for ever. Anything but a regular
// file is refused unopened, and opening does not block should a FIFO take
// the file's place meanwhile; the open file's own mode decides.
func ReadRegular(path string, limit int64) ([]byte, error) {
	// A file that cannot be stat'ed fails to open below, with that error.
	if info, err := os.Stat(path); err == nil {
		if err := regular(info); err != nil {
			return nil, &fs.PathError{Op: "open", Path: path, Err: err}
		}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err == nil {
		err = regular(info)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	// Not the size from stat: the file may grow while it is read.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("larger than %d bytes", limit)}
	}
	return data, nil
}

func regular(info fs.FileInfo) error {
	if info.Mode().IsRegular() {
		return nil
	}
	return fmt.Errorf("not a regular file (mode %s)", info.Mode().Type())
}
