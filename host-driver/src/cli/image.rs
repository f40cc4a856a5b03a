//! `nicctl image`: inspect firmware image files.

use std::fmt::Write as _;
use std::path::PathBuf;

use shared_abi::image::ImageTarget;

use super::{CliResult, parse_target};
use nicbar_image::image::{ImageFile, header_summary};

/// `nicctl image` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print an image file's header and verify the whole file.
    ///
    /// Checks the magic, the format version, the header CRC, that the image was built for this
    /// host's ABI version, that its target is known (and is --target, if given), that the file is
    /// exactly as long as the header says and that the payload matches its CRC. Exits with
    /// status 1 and says which check failed and with which value if any does.
    Info(InfoArgs),
}

/// Arguments of `nicctl image info`.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// The image file.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Print the header as one JSON object on stdout (on refusal too, with "valid": false and the
    /// "error").
    #[arg(long)]
    json: bool,

    /// Also refuse an image that is not for this target.
    #[arg(long, value_name = "TRIPLE", value_parser = parse_target)]
    target: Option<ImageTarget>,
}

/// Runs an `nicctl image` subcommand.
///
/// # Errors
/// The refusal, naming the file and the failed check.
pub fn run(command: Command) -> CliResult {
    match command {
        Command::Info(args) => info(&args),
    }
}

fn info(args: &InfoArgs) -> CliResult {
    let read = match args.target {
        Some(target) => ImageFile::read_for_target(&args.file, target),
        None => ImageFile::read(&args.file),
    };
    let image = match read {
        Ok(image) => image,
        Err(error) => {
            if args.json {
                println!(
                    "{{\"file\":{},\"valid\":false,\"error\":{}}}",
                    json_string(&args.file.display().to_string()),
                    json_string(&error.to_string())
                );
            }
            return Err(error.into());
        }
    };
    let header = image.header();
    if args.json {
        println!("{}", info_json(&image));
    } else {
        println!("{}", header_summary(image.path(), header));
        println!("verified  header CRC, ABI version, target, length and payload CRC");
    }
    Ok(())
}

/// Addresses and CRCs are hex strings: a JSON number loses precision above 2^53.
fn info_json(image: &ImageFile) -> String {
    let header = image.header();
    format!(
        "{{\"file\":{},\"valid\":true,\"image_len\":{},\"format_version\":{},\"abi_version\":{},\
         \"target\":{},\"load_address\":\"{:#x}\",\"entry_point\":\"{:#x}\",\"payload_len\":{},\
         \"payload_crc32\":\"{:#010x}\",\"header_crc32\":\"{:#010x}\"}}",
        json_string(&image.path().display().to_string()),
        header.image_len(),
        header.format_version.get(),
        header.abi_version.get(),
        json_string(&header.target.to_string()),
        header.load_address.get(),
        header.entry_point.get(),
        header.payload_len.get(),
        header.payload_crc32.get(),
        header.header_crc32.get(),
    )
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for character in text.chars() {
        match character {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            control if u32::from(control) < 0x20 => {
                let _ = write!(quoted, "\\u{:04x}", u32::from(control));
            }
            other => quoted.push(other),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::json_string;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(
            json_string("a\"b\\c\nd\u{1}é"),
            "\"a\\\"b\\\\c\\nd\\u0001é\""
        );
    }
}
