package volumeadmission

import (
	"context"
	"crypto/tls"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/pki"
)

const (
	// Port is where every server serves the webhook, on loopback only:
	// the apiserver beside it is its one client.
	Port = 6446
	// Path is the webhook's path.
	Path = "/validate-persistentvolume"
)

// URL is where an apiserver reaches the webhook of its own server.
func URL() string {
	return "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(Port)) + Path
}

var log = logrus.WithField("component", "volume-admission")

// Config is what the webhook is served with.
type Config struct {
	// Client reads claims and storage classes; the server's admin.
	Client kubernetes.Interface
	// Serving is the apiserver's serving certificate: signed by the server
	// CA, which the webhook configuration trusts, and valid for
	// 127.0.0.1. It is read again when renewed.
	Serving pki.Pair
}

// Start listens and serves the webhook until stopped. A port that is
// taken, or a certificate that does not load, fails here.
func Start(ctx context.Context, cfg Config) (*component.Running, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("volume admission: listen on %s: %w (`ss -ltnp 'sport = %d'` shows who holds it)", addr, err, Port)
	}
	run, err := serve(cfg, ln)
	if err != nil {
		ln.Close()
		return nil, err
	}
	log.WithField("address", addr).Debug("serving the volume admission webhook")
	return component.Go("volume admission", run), nil
}

// serve is what Start runs on ln.
func serve(cfg Config, ln net.Listener) (func(context.Context) error, error) {
	// The apiserver serves with the same files and reloads them the same
	// way: on a change seen by fsnotify, and every minute.
	content, err := dynamiccertificates.NewDynamicServingContentFromFiles("volume-admission", cfg.Serving.Cert, cfg.Serving.Key)
	if err != nil {
		return nil, fmt.Errorf("volume admission: load the serving certificate %s: %w", cfg.Serving.Cert, err)
	}
	serving := dynamiccertificates.NewDynamicServingCertificateController(&tls.Config{MinVersion: tls.VersionTLS12}, nil, content, nil, nil)
	content.AddListener(serving)
	if err := serving.RunOnce(); err != nil {
		return nil, fmt.Errorf("volume admission: serving certificate %s: %w", cfg.Serving.Cert, err)
	}
	w := &webhook{client: cfg.Client, listen: ln, content: content, serving: serving}
	return w.run, nil
}

type webhook struct {
	client  kubernetes.Interface
	listen  net.Listener
	content *dynamiccertificates.DynamicCertKeyPairContent
	serving *dynamiccertificates.DynamicServingCertificateController
}

func (w *webhook) run(ctx context.Context) error {
	defer w.listen.Close()
	go w.content.Run(ctx, 1)
	go w.serving.Run(1, ctx.Done())

	r := newReviewer(w.client)

	mux := http.NewServeMux()
	mux.Handle(Path, r)
	errorLog := log.WriterLevel(logrus.DebugLevel)
	defer errorLog.Close()
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{GetConfigForClient: w.serving.GetConfigForClient, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          stdlog.New(errorLog, "", 0),
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(w.listen, "", "") }()
	select {
	case err := <-served:
		return fmt.Errorf("serve the volume admission webhook: %w", err)
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			srv.Close()
		}
		return nil
	}
}
