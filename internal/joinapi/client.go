package joinapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/token"
)

// ErrRefused is a join the server answered with no: trying again cannot
// help.
var ErrRefused = errors.New("the server refused to join this machine")

// Client asks a server's join API, trusting the server CA the token pins.
type Client struct {
	Server string // https URL
	Token  token.Token
	// CAFile is the server CA pinned at an earlier join; if it does not
	// exist, the server's bundle is fetched and only what the token's hash
	// vouches for in it is trusted (pki.PinnedCA).
	CAFile string
	// Cert is a joined node's client certificate, which it renews its
	// certificates with instead of a token; empty: none.
	Cert pki.Pair
}

// maxAnswer caps what a join request reads of an answer: certificates,
// keys and settings, a few KiB.
const maxAnswer = 1 << 20

// maxCABundle caps what /cacerts may answer: a CA bundle holds at most
// three certificates (during a CA rotation), each under 1 KiB.
const maxCABundle = 64 << 10

// Post sends req to path and decodes the answer into resp. It returns the
// CA it verified the server with, which is what the caller may keep: the
// one pinned at an earlier join, or the certificates of the server's
// bundle the token's hash vouches for (pki.PinnedCA). Answers that say no
// wrap ErrRefused.
func (c Client) Post(ctx context.Context, path string, req, resp any) (ca []byte, err error) {
	ca, first, err := c.serverCA(ctx)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		if first { // trusted on first use, with a short token
			return nil, fmt.Errorf("%w: %s answered %s with no PEM certificate: check that --server is the address of a kelp server (https://<server>:6443)", ErrRefused, c.Server, CACertsPath)
		}
		return nil, fmt.Errorf("%w: %s holds no PEM certificate: move it aside to join again", ErrRefused, c.CAFile)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Server+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if c.Token.Secret != "" {
		r.Header.Set(TokenHeader, c.Token.User+":"+c.Token.Secret)
	}
	r.Header.Set("Content-Type", "application/json")
	tlsConfig := &tls.Config{RootCAs: pool}
	if c.Cert.Cert != "" {
		cert, err := tls.LoadX509KeyPair(c.Cert.Cert, c.Cert.Key)
		if err != nil {
			return nil, fmt.Errorf("load the client certificate: %w", err)
		}
		tlsConfig.Certificates = []tls.Certificate{cert}
	}
	client := httpClient(30*time.Second, tlsConfig)
	defer client.CloseIdleConnections()
	answer, err := client.Do(r)
	var unknown x509.UnknownAuthorityError
	switch {
	case errors.As(err, &unknown) && first && c.Token.CAHash != "":
		return nil, fmt.Errorf("%w: %s serves the CA the token names at %s, but presents a certificate that this CA did not sign: a machine between this one and the server answers in its place (the token was not sent); check --server and the network path to the server", ErrRefused, c.Server, CACertsPath)
	case errors.As(err, &unknown) && c.Token.CAHash != "" && !c.tokenNames(ca):
		return nil, fmt.Errorf("%w: the CA this machine pinned at its first join (%s) does not verify the server, and the token's CA hash is not that CA's: the token is from another cluster; to join it, move this machine's data dir aside", ErrRefused, c.CAFile)
	case errors.Is(err, ErrRefused): // a redirect, in a *url.Error
		return nil, errors.Unwrap(err)
	case err != nil:
		return nil, fmt.Errorf("join %s: %w", c.Server, err)
	}
	defer answer.Body.Close()
	// What the server warns of (an agent that joins with the server
	// token) is for whoever runs this machine to read.
	warnings, _ := utilnet.ParseWarningHeaders(answer.Header.Values("Warning"))
	for _, w := range warnings {
		log.WithField("server", c.Server).Warn(w.Text)
	}
	data, err := readAnswer(answer.Body, maxAnswer)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", c.Server, err)
	}
	switch answer.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		if apiserverStatus(answer, data) {
			// The apiserver's own no, not the join API's: a server that
			// has just started denies what RBAC grants until its
			// authorizer has read the roles, kelp's for joins too.
			return nil, &RetryLaterError{Server: c.Server, Status: answer.Status, Message: "the server does not let joins through yet (it is starting): " + strings.TrimSpace(string(data))}
		}
		return nil, fmt.Errorf("%w: %s", ErrRefused, strings.TrimSpace(string(data)))
	case http.StatusConflict, http.StatusBadRequest:
		return nil, fmt.Errorf("%w: %s", ErrRefused, strings.TrimSpace(string(data)))
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return nil, &RetryLaterError{Server: c.Server, Status: answer.Status, Message: strings.TrimSpace(string(data)),
			RetryAfter: retryAfter(answer.Header.Get("Retry-After"), time.Now())}
	default:
		return nil, fmt.Errorf("join %s: %s: %s", c.Server, answer.Status, strings.TrimSpace(string(data)))
	}
	if err := json.Unmarshal(data, resp); err != nil {
		return nil, fmt.Errorf("join %s: malformed answer: %w", c.Server, err)
	}
	return ca, nil
}

// apiserverStatus says whether an answer is a Status of the apiserver
// (JSON), which the join API's own answers (plain text) never are.
func apiserverStatus(answer *http.Response, data []byte) bool {
	if !strings.HasPrefix(answer.Header.Get("Content-Type"), "application/json") {
		return false
	}
	var status struct{ Kind, APIVersion string }
	return json.Unmarshal(data, &status) == nil && status.Kind == "Status" && status.APIVersion == "v1"
}

// A RetryLaterError is a server's answer to wait before trying again: the
// join API turns an address away for a while after wrong tokens came from
// it (429), as the apiserver does while it is overloaded (429) or starting
// (503).
type RetryLaterError struct {
	Server, Status, Message string
	// RetryAfter is how long the server asked to wait; 0: it did not say.
	RetryAfter time.Duration
}

func (e *RetryLaterError) Error() string {
	return fmt.Sprintf("join %s: %s: %s", e.Server, e.Status, e.Message)
}

// retryAfter reads a Retry-After header, seconds or an HTTP date; 0 when
// it is absent or malformed.
func retryAfter(header string, now time.Time) time.Duration {
	if seconds, err := strconv.Atoi(strings.TrimSpace(header)); err == nil {
		return max(time.Duration(seconds)*time.Second, 0)
	}
	if t, err := http.ParseTime(header); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// MaxRetryAfter bounds how long a join waits because the server asked it
// to: the join API turns an address away for at most maxBackoff, and a
// longer Retry-After is a mistake or a server that is not kelp's.
const MaxRetryAfter = maxBackoff

// Wait waits before a join that failed with err is tried again: backoff,
// or as long as the server asked with Retry-After when that is longer, up
// to MaxRetryAfter. It logs why once, on log. It returns ctx's error if
// ctx ends first.
func Wait(ctx context.Context, log *logrus.Entry, err error, backoff time.Duration) error {
	wait, later := retryDelay(err, backoff)
	if later != nil {
		log.WithField("server", later.Server).Warnf("the server asks this machine to wait before it tries to join again (%s: %s); trying again in %s", later.Status, later.Message, wait)
	} else {
		log.WithError(err).Warnf("cannot join yet; trying again in %s", wait)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// retryDelay is how long Wait waits, and the answer that asked for it
// when that is longer than backoff.
func retryDelay(err error, backoff time.Duration) (time.Duration, *RetryLaterError) {
	var later *RetryLaterError
	if errors.As(err, &later) && later.RetryAfter > backoff {
		return min(later.RetryAfter, MaxRetryAfter), later
	}
	return backoff, nil
}

// tokenNames says whether the token's hash vouches for something in ca.
func (c Client) tokenNames(ca []byte) bool {
	_, err := pki.PinnedCA(ca, c.Token.CAHash)
	return err == nil
}

// serverCA is the CA pinned at an earlier join, or, at the first (first
// is true), the part of the server's bundle that the token's hash vouches
// for, or with a short token, the whole bundle, trusted on first use.
// The hash vouches for the first contact only: a pinned CA changes by a
// CA rotation (kelp certificate rotate-ca), over connections it verified,
// and then no longer matches the tokens made before.
func (c Client) serverCA(ctx context.Context) (ca []byte, first bool, err error) {
	ca, err = os.ReadFile(c.CAFile)
	if err == nil {
		return ca, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("read the pinned server CA: %w", err)
	}
	if ca, err = fetchCA(ctx, c.Server); err != nil {
		return nil, true, err
	}
	if c.Token.CAHash == "" {
		log.Warn("the token has no CA hash: trusting the server's CA on first use; use the full token to pin it (as `kelp token create` prints it; a server's: <data-dir>/server/token)")
		return ca, true, nil
	}
	pinned, err := pki.PinnedCA(ca, c.Token.CAHash)
	if errors.Is(err, pki.ErrCAHashMismatch) {
		return nil, true, fmt.Errorf("%w: %w (%s%s serves %d certificate(s); neither one of them nor all together has that hash): check --server and the token (make one again with `kelp token create` on a server of this cluster, or for a server copy <data-dir>/server/token; tokens from before a `kelp certificate rotate-ca --finish` no longer join), or something between this machine and %s is not the server", ErrRefused, err, c.Server, CACertsPath, strings.Count(string(ca), "-----BEGIN CERTIFICATE-----"), c.Server)
	}
	if err != nil {
		return nil, true, fmt.Errorf("%w: %s answered %s with %w: check that --server is the address of a kelp server (https://<server>:6443)", ErrRefused, c.Server, CACertsPath, err)
	}
	return pinned, true, nil
}

// CACerts returns the server's CA bundle as it serves it now, over a
// connection verified with the pinned one (CAFile).
func (c Client) CACerts(ctx context.Context) ([]byte, error) {
	pinned, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pinned) {
		return nil, fmt.Errorf("%s holds no PEM certificate", c.CAFile)
	}
	return getCA(ctx, c.Server, &tls.Config{RootCAs: pool})
}

// fetchCA reads the server's CA without verifying the server: the caller
// checks it against the token's hash.
func fetchCA(ctx context.Context, server string) ([]byte, error) {
	ca, err := getCA(ctx, server, &tls.Config{InsecureSkipVerify: true})
	var tooLarge errTooLarge
	if errors.As(err, &tooLarge) {
		return nil, fmt.Errorf("%w: %w: a kelp server's CA bundle is a few KiB; check that --server is the address of a kelp server (https://<server>:6443)", ErrRefused, err)
	}
	return ca, err
}

// getCA asks server for its CA bundle.
func getCA(ctx context.Context, server string, tlsConfig *tls.Config) ([]byte, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, server+CACertsPath, nil)
	if err != nil {
		return nil, err
	}
	client := httpClient(10*time.Second, tlsConfig)
	defer client.CloseIdleConnections()
	resp, err := client.Do(r)
	if errors.Is(err, ErrRefused) { // a redirect, in a *url.Error
		return nil, errors.Unwrap(err)
	}
	if err != nil {
		return nil, fmt.Errorf("reach %s: %w", server, err)
	}
	defer resp.Body.Close()
	data, err := readAnswer(resp.Body, maxCABundle)
	if err != nil {
		return nil, fmt.Errorf("get the CA of %s: %w", server, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get the CA of %s: %s: %s", server, resp.Status, strings.TrimSpace(string(data)))
	}
	return data, nil
}

// httpClient is a client for the join API that follows no redirect: a
// join request carries the token in a header, which Go's client would
// send on to wherever a redirect points.
func httpClient(timeout time.Duration, tlsConfig *tls.Config) *http.Client {
	return &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{TLSClientConfig: tlsConfig},
		CheckRedirect: func(r *http.Request, via []*http.Request) error {
			return fmt.Errorf("%w: %s answered %s with a redirect to %s, which a join does not follow (its requests carry the token): give --server the address of a kelp server itself", ErrRefused, via[0].URL.Host, via[0].URL.Path, r.URL.Redacted())
		},
	}
}

// errTooLarge is an answer longer than its cap.
type errTooLarge struct{ limit int64 }

func (e errTooLarge) Error() string {
	return fmt.Sprintf("the answer is larger than %d KiB", e.limit>>10)
}

// readAnswer reads body, up to limit bytes.
func readAnswer(body io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, errTooLarge{limit}
	}
	return data, nil
}
