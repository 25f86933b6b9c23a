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
	"strings"
	"time"

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
	// exist, the server's is fetched and checked against the token's hash.
	CAFile string
	// Cert is a joined node's client certificate, which it renews its
	// certificates with instead of a token; empty: none.
	Cert pki.Pair
}

// Post sends req to path and decodes the answer into resp. It returns the
// CA it trusted. Answers that say no wrap ErrRefused.
func (c Client) Post(ctx context.Context, path string, req, resp any) (ca []byte, err error) {
	ca, err = c.serverCA(ctx)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%w: the server's CA is not a PEM certificate", ErrRefused)
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
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	answer, err := client.Do(r)
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) && c.Token.CAHash != "" && !pki.CAHashMatches(ca, c.Token.CAHash) {
		return nil, fmt.Errorf("%w: the CA this machine pinned at its first join (%s) does not verify the server, and the token's CA hash is not that CA's: the token is from another cluster; to join it, move this machine's data dir aside", ErrRefused, c.CAFile)
	}
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", c.Server, err)
	}
	defer answer.Body.Close()
	data, err := io.ReadAll(io.LimitReader(answer.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", c.Server, err)
	}
	switch answer.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusConflict, http.StatusBadRequest:
		return nil, fmt.Errorf("%w: %s", ErrRefused, strings.TrimSpace(string(data)))
	default:
		return nil, fmt.Errorf("join %s: %s: %s", c.Server, answer.Status, strings.TrimSpace(string(data)))
	}
	if err := json.Unmarshal(data, resp); err != nil {
		return nil, fmt.Errorf("join %s: malformed answer: %w", c.Server, err)
	}
	return ca, nil
}

// serverCA is the CA pinned at an earlier join, or the server's if it
// matches the token's hash, or with a short token, trusted on first use.
// The hash vouches for the first contact only: a pinned CA changes by a
// CA rotation (kelp certificate rotate-ca), over connections it verified,
// and then no longer matches the tokens made before.
func (c Client) serverCA(ctx context.Context) ([]byte, error) {
	ca, err := os.ReadFile(c.CAFile)
	if err == nil {
		return ca, nil
	}
	if ca, err = fetchCA(ctx, c.Server); err != nil {
		return nil, err
	}
	if c.Token.CAHash == "" {
		log.Warn("the token has no CA hash: trusting the server's CA on first use; use the full token from <data-dir>/server/token to pin it")
		return ca, nil
	}
	if !pki.CAHashMatches(ca, c.Token.CAHash) {
		return nil, fmt.Errorf("%w: its CA does not match the token's hash; the token is from another cluster, or from before its CAs were rotated (take the token from the server's <data-dir>/server/token), or something between this machine and %s is not the server", ErrRefused, c.Server)
	}
	return ca, nil
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
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+CACertsPath, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(r)
	if err != nil {
		return nil, fmt.Errorf("reach %s: %w", c.Server, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("get the CA of %s: %w", c.Server, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get the CA of %s: %s: %s", c.Server, resp.Status, strings.TrimSpace(string(data)))
	}
	return data, nil
}

// fetchCA reads the server's CA without verifying the server: the caller
// checks it against the token's hash.
func fetchCA(ctx context.Context, server string) ([]byte, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, server+CACertsPath, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(r)
	if err != nil {
		return nil, fmt.Errorf("reach %s: %w", server, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("get the CA of %s: %w", server, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get the CA of %s: %s: %s", server, resp.Status, strings.TrimSpace(string(data)))
	}
	return data, nil
}
