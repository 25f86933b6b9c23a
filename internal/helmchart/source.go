package helmchart

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"syscall"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/repo"
	"sigs.k8s.io/yaml"
)

// KubernetesAPI in spec.chart or spec.repo stands for this server's
// host:port, as in k3s: https://%{KUBERNETES_API}%/static/charts/NAME.tgz
// names a file of the static charts directory.
const KubernetesAPI = "%{KUBERNETES_API}%"

const (
	// maxDownload bounds a chart archive or a repository index: Helm's
	// own bound on a chart's unpacked size.
	maxDownload = 100 << 20
	// downloadTimeout bounds one download, headers and body.
	downloadTimeout = 2 * time.Minute
)

// failure is an error with the reason the Deployed condition gives for it.
type failure struct {
	reason string
	// final says that trying again cannot help: only a new spec can.
	final bool
	err   error
}

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

func fail(reason, format string, args ...any) error {
	return &failure{reason: reason, err: fmt.Errorf(format, args...)}
}

// reasonOf is the reason a failure carries; anything else is Helm's.
func reasonOf(err error) string {
	if f, ok := errors.AsType[*failure](err); ok {
		return f.reason
	}
	return ReasonInstallFailed
}

// fetcher loads the charts that specs name.
type fetcher struct {
	// apiHost is this server's host:port, which KubernetesAPI stands for.
	apiHost string
	// api reaches apiHost with the admin's credentials; it is used for
	// the static charts only.
	api *http.Client
	// allowLocal lets charts come from loopback and link-local addresses
	// (--helm-allow-local-repos).
	allowLocal bool
}

// load returns the chart s names, with its dependencies in place.
func (f fetcher) load(ctx context.Context, s Spec) (*chart.Chart, error) {
	if s.ChartContent != "" {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s.ChartContent))
		if err != nil {
			return nil, &failure{reason: ReasonChartInvalid, final: true, err: fmt.Errorf("spec.chartContent is not base64: %w", err)}
		}
		ch, err := loadArchive(b, "spec.chartContent")
		if f, ok := errors.AsType[*failure](err); ok {
			f.final = true
		}
		return ch, err
	}
	ref := strings.ReplaceAll(s.Chart, KubernetesAPI, f.apiHost)
	repoURL := strings.ReplaceAll(s.Repo, KubernetesAPI, f.apiHost)
	var chartURL, digest string
	switch {
	case ref == "":
		return nil, fail(ReasonChartUnavailable, "spec.chart is empty: name a chart of spec.repo, give a chart URL, or put the chart archive in spec.chartContent")
	case strings.HasPrefix(ref, "oci://"):
		return nil, fail(ReasonChartUnavailable, "chart %s: OCI registries are not supported; use a chart repository, a chart URL, spec.chartContent or the static charts directory", ref)
	case isHTTP(ref):
		chartURL = ref
	case repoURL != "":
		var err error
		// k3s manifests may name the chart as "repo/name".
		if chartURL, digest, err = f.find(ctx, s, repoURL, path.Base(ref)); err != nil {
			return nil, err
		}
	default:
		return nil, fail(ReasonChartUnavailable, "chart %q names no repository: set spec.repo, give a chart URL, or put the chart archive in spec.chartContent", ref)
	}
	b, err := f.get(ctx, s, chartURL)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(b); digest != "" && !strings.EqualFold(hex.EncodeToString(sum[:]), digest) {
		return nil, fail(ReasonChartInvalid, "%s has sha256 %x, but the repository's index says %s: the archive or the index was changed", chartURL, sum, digest)
	}
	return loadArchive(b, chartURL)
}

// find looks name up in the index of the repository at repoURL and returns
// the URL of the version s asks for (a version or a semver range; empty:
// the latest), and the sha256 the index gives for its archive, if any.
func (f fetcher) find(ctx context.Context, s Spec, repoURL, name string) (chartURL, digest string, _ error) {
	indexURL := strings.TrimSuffix(repoURL, "/") + "/index.yaml"
	b, err := f.get(ctx, s, indexURL)
	if err != nil {
		return "", "", err
	}
	var index repo.IndexFile
	if err := yaml.Unmarshal(b, &index); err != nil {
		return "", "", fail(ReasonChartUnavailable, "%s is not a chart repository index: %w", indexURL, err)
	}
	for n, versions := range index.Entries {
		index.Entries[n] = dropNil(versions)
	}
	index.SortEntries()
	version, err := index.Get(name, s.Version)
	if err != nil {
		what := fmt.Sprintf("chart %q", name)
		if s.Version != "" {
			what += fmt.Sprintf(" version %q", s.Version)
		}
		return "", "", fail(ReasonChartUnavailable, "%s not found in repository %s (check spec.chart and spec.version)", what, repoURL)
	}
	if len(version.URLs) == 0 {
		return "", "", fail(ReasonChartUnavailable, "chart %q version %s in repository %s has no URL", name, version.Version, repoURL)
	}
	u, err := repo.ResolveReferenceURL(repoURL, version.URLs[0])
	if err != nil {
		return "", "", fail(ReasonChartUnavailable, "chart %q in repository %s: %w", name, repoURL, err)
	}
	return u, version.Digest, nil
}

// dropNil leaves out the empty entries a hand-written index may have,
// which repo.IndexFile.Get would trip over.
func dropNil(versions repo.ChartVersions) repo.ChartVersions {
	var out repo.ChartVersions
	for _, v := range versions {
		if v != nil && v.Metadata != nil {
			out = append(out, v)
		}
	}
	return out
}

// get downloads rawURL, at most maxDownload of it.
func (f fetcher) get(ctx context.Context, s Spec, rawURL string) ([]byte, error) {
	u, err := url.Parse(rawURL)
	if err != nil || !isHTTP(rawURL) {
		return nil, fail(ReasonChartUnavailable, "%q is not an http:// or https:// URL", rawURL)
	}
	client, err := f.client(s, u)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, downloadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, fail(ReasonChartUnavailable, "get %s: %w", rawURL, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fail(ReasonChartUnavailable, "get %s: %w", rawURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fail(ReasonChartUnavailable, "get %s: %s", rawURL, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDownload+1))
	if err != nil {
		return nil, fail(ReasonChartUnavailable, "get %s: %w", rawURL, err)
	}
	if len(b) > maxDownload {
		return nil, fail(ReasonChartUnavailable, "get %s: larger than %d MiB", rawURL, maxDownload>>20)
	}
	return b, nil
}

// client is how u is reached: this server's static charts with the admin's
// credentials (and nothing else of this server), anything else with the
// system's CAs, spec.repoCA, and the proxy of kelp's environment.
func (f fetcher) client(s Spec, u *url.URL) (*http.Client, error) {
	if u.Host == f.apiHost {
		if !strings.HasPrefix(u.Path, StaticPrefix) {
			return nil, fail(ReasonChartUnavailable, "%s: of this server, only %s serves charts", u, StaticPrefix)
		}
		return f.api, nil
	}
	tlsConfig := &tls.Config{InsecureSkipVerify: s.InsecureSkipTLSVerify}
	if s.RepoCA != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM([]byte(s.RepoCA)) {
			return nil, fail(ReasonChartUnavailable, "spec.repoCA holds no PEM certificate")
		}
		tlsConfig.RootCAs = pool
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConfig
	if !f.allowLocal {
		transport.DialContext = (&net.Dialer{Timeout: 30 * time.Second, Control: refuseLocal}).DialContext
	}
	// One request per client: a kept connection would outlive it.
	transport.DisableKeepAlives = true
	return &http.Client{Transport: transport}, nil
}

func loadArchive(b []byte, from string) (*chart.Chart, error) {
	ch, err := loader.LoadArchive(bytes.NewReader(b))
	if err != nil {
		return nil, fail(ReasonChartInvalid, "%s is not a chart archive: %w", from, err)
	}
	if deps := ch.Metadata.Dependencies; deps != nil {
		if err := action.CheckDependencies(ch, deps); err != nil {
			return nil, fail(ReasonChartInvalid, "%s: %w (put the dependencies' archives in the chart's charts/ directory)", from, err)
		}
	}
	return ch, nil
}

func isHTTP(s string) bool {
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
}

// refuseLocal refuses a connection to a loopback, link-local, unspecified
// or cloud metadata address, which a HelmChart could otherwise point the
// server at: its own ports, or a cloud's metadata service and the
// credentials it hands out (169.254.169.254, fd00:ec2::254). It checks
// the address being dialled, after name resolution and redirects, so no
// name that resolves there (DNS rebinding included) gets around it. The
// private ranges (10/8, 172.16/12, 192.168/16, fc00::/7) stay open: charts
// are served from LANs too (README, Helm charts).
func refuseLocal(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return err
	}
	ip = ip.Unmap().WithZone("")
	// An IPv4 address through NAT64 (RFC 6052's well-known prefix) is
	// that address.
	if nat64 := netip.MustParsePrefix("64:ff9b::/96"); nat64.Contains(ip) {
		b := ip.As16()
		ip = netip.AddrFrom4([4]byte(b[12:]))
	}
	if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || metadataService(ip) {
		return fmt.Errorf("%s is a loopback, link-local or cloud metadata address, which HelmCharts may not fetch from (kelp server --helm-allow-local-repos allows it)", ip)
	}
	return nil
}

// metadataService says whether ip is a cloud's metadata service outside
// the link-local ranges: AWS's over IPv6 (in the unique local range, which
// LANs use too) and Alibaba Cloud's (in the shared range 100.64.0.0/10).
func metadataService(ip netip.Addr) bool {
	switch ip.String() {
	case "fd00:ec2::254", "100.100.100.200":
		return true
	}
	return false
}
