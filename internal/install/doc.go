// Package install tests install.sh, the script at the repository's root
// that installs kelp as a systemd or OpenRC service, upgrades it and
// writes its uninstaller. The tests run the real script as root in a
// network and mount namespace of their own, over a fake root (overlays of
// /etc, /usr/local, /opt and /var/lib whose writes land in the test's temp
// dir), against release artifacts served on 127.0.0.1 in that namespace;
// only the service manager (systemctl, rc-service, rc-update, openrc-run)
// is a stub that records its calls. The machine itself is never changed.
package install
