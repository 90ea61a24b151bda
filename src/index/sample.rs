//! A three-file sample repository (billing code and its README): what the integration tests
//! index and what `aptix-bench --fixture-corpus` indexes when small stage messages are wanted.

use std::path::Path;

/// Writes the sample repository under `root`.
pub fn write_sample_repo(root: &Path) -> std::io::Result<()> {
    let files = [
        ("billing/invoice.rs", "/// Sends the invoice e-mail.\npub fn send_invoice_email(invoice: &Invoice) -> Result<(), MailError> {\n    mailer::send(&invoice.customer, render(invoice))\n}\n"),
        ("billing/tax.rs", "/// Computes VAT for an invoice line.\npub fn vat_for_line(line: &Line) -> Money {\n    line.amount * line.rate\n}\n"),
        ("docs/README.md", "# Billing\n\nInvoices are e-mailed by `send_invoice_email`.\n"),
    ];
    for (path, text) in files {
        let p = root.join(path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(p, text)?;
    }
    Ok(())
}
