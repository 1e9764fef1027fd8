pub struct TranslateOptions;
pub struct Translation;
pub struct Warning;
pub fn service_vips() {}
