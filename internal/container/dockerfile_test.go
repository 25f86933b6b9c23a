package container_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// image is what the Dockerfile's last stage says about the image besides
// its files, which are rootfs.sh's.
type image struct {
	env        []string // ENV, as K=V
	volumes    []string
	ports      []string
	entrypoint []string
	cmd        []string
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	keyword string // upper case
	args    string
}

type stage struct {
	from         string // FROM's arguments
	name         string // after AS
	instructions []instruction
}

// finalInstructions are those the last stage may hold: each is applied by
// the test as docker would, or checked. A RUN, ADD or USER there would
// change the image in a way the test does not run.
var finalInstructions = []string{"COPY", "ENV", "VOLUME", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL", "STOPSIGNAL"}

// readDockerfile parses the Dockerfile at the top of repo and checks what
// keeps it and scripts/rootfs.sh in step: the last stage is FROM scratch
// with one COPY of the directory rootfs.sh built in the builder stage, the
// builder's Go is go.mod's, and the entrypoint is in exec form (the image
// has no shell).
func readDockerfile(t *testing.T, repo string) image {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	globals, stages := parseDockerfile(string(data))
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a builder and the image", len(stages))
	}

	gomod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if goVersion == nil {
		t.Fatal("go.mod has no go line")
	}
	if want := "GO_VERSION=" + string(goVersion[1]); !slices.Contains(globals, want) {
		t.Errorf("Dockerfile: global ARGs %q, want %s (go.mod's go line)", globals, want)
	}

	last := stages[len(stages)-1]
	if last.from != "scratch" {
		t.Errorf("Dockerfile: last stage is FROM %s, want scratch: the image is rootfs.sh's directory alone", last.from)
	}
	var img image
	var copies []string
	for _, in := range last.instructions {
		switch in.keyword {
		case "COPY":
			copies = append(copies, in.args)
		case "ENV":
			for _, kv := range strings.Fields(in.args) {
				if !strings.Contains(kv, "=") || strings.ContainsAny(kv, `"'$`) {
					t.Fatalf("Dockerfile: ENV %s: the test reads plain K=V pairs only", in.args)
				}
				img.env = append(img.env, kv)
			}
		case "VOLUME":
			img.volumes = jsonList(t, in)
		case "EXPOSE":
			img.ports = append(img.ports, strings.Fields(in.args)...)
		case "ENTRYPOINT":
			img.entrypoint = jsonList(t, in)
		case "CMD":
			img.cmd = jsonList(t, in)
		default:
			if !slices.Contains(finalInstructions, in.keyword) {
				t.Errorf("Dockerfile: %s in the last stage: the image must be what scripts/rootfs.sh builds (move it there)", in.keyword)
			}
		}
	}
	if len(copies) != 1 {
		t.Fatalf("Dockerfile: last stage has COPY %q, want one COPY --from=<builder> /rootfs/ /", copies)
	}
	builder, ok := strings.CutPrefix(copies[0], "--from=")
	builder, rest, _ := strings.Cut(builder, " ")
	if !ok || strings.Join(strings.Fields(rest), " ") != "/rootfs/ /" {
		t.Fatalf("Dockerfile: COPY %s, want COPY --from=<builder> /rootfs/ /", copies[0])
	}
	i := slices.IndexFunc(stages, func(s stage) bool { return s.name == builder })
	if i < 0 {
		t.Fatalf("Dockerfile: COPY --from=%s names no stage", builder)
	}
	if !strings.Contains(stages[i].from, "golang:${GO_VERSION}-") {
		t.Errorf("Dockerfile: builder is FROM %s, want golang:${GO_VERSION}-…", stages[i].from)
	}
	if !slices.ContainsFunc(stages[i].instructions, func(in instruction) bool {
		return in.keyword == "RUN" && strings.Contains(in.args, "scripts/rootfs.sh /rootfs")
	}) {
		t.Errorf("Dockerfile: stage %s does not RUN scripts/rootfs.sh /rootfs", builder)
	}
	if len(img.entrypoint) == 0 {
		t.Fatal("Dockerfile: no ENTRYPOINT")
	}
	return img
}

// parseDockerfile returns the ARGs before the first FROM, as K=V, and the
// stages.
func parseDockerfile(text string) (globals []string, stages []stage) {
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue // comments may sit between continuation lines too
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	for _, line := range logical {
		keyword, args, _ := strings.Cut(line, " ")
		in := instruction{keyword: strings.ToUpper(keyword), args: strings.TrimSpace(args)}
		switch {
		case in.keyword == "FROM":
			f := strings.Fields(in.args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--platform=") })
			s := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
		case len(stages) == 0:
			if in.keyword == "ARG" {
				globals = append(globals, in.args)
			}
		default:
			stages[len(stages)-1].instructions = append(stages[len(stages)-1].instructions, in)
		}
	}
	return globals, stages
}

// jsonList reads the exec (JSON) form of an instruction.
func jsonList(t *testing.T, in instruction) []string {
	t.Helper()
	var list []string
	if err := json.Unmarshal([]byte(in.args), &list); err != nil {
		t.Fatalf("Dockerfile: %s %s: want the JSON form (the image has no shell): %v", in.keyword, in.args, err)
	}
	return list
}

// TestDockerfile checks, without root, that the Dockerfile keeps to what
// TestImage runs.
func TestDockerfile(t *testing.T) {
	img := readDockerfile(t, testcluster.Repository(t))
	if !slices.Equal(img.entrypoint, []string{"/bin/kelp"}) || !slices.Contains(img.volumes, "/var/lib/kelp") || !slices.Contains(img.ports, "6443") {
		t.Errorf("image %+v: want ENTRYPOINT [\"/bin/kelp\"], VOLUME /var/lib/kelp and EXPOSE 6443", img)
	}
}
